/* Provider defaults in one table: each hosted API's endpoint, default model and the variable
 * its key is read from, and the local servers --local names. */
#include "model.h"

#include <string.h>

static const struct al_provider hosted[] = {
    {"openai", AL_API_OPENAI, "https://api.openai.com/v1", "gpt-4o-mini", "OPENAI_API_KEY"},
    {"anthropic", AL_API_ANTHROPIC, "https://api.anthropic.com", "claude-sonnet-4-5",
     "ANTHROPIC_API_KEY"},
    {"openai", AL_API_RESPONSES, "https://api.openai.com/v1", "gpt-4o-mini", "OPENAI_API_KEY"},
};

static const struct al_provider local[] = {
    {"ollama", AL_API_OPENAI, "http://localhost:11434/v1", "llama3.1", NULL},
    {"llamacpp", AL_API_OPENAI, "http://localhost:8080/v1", "local", NULL},
    {"lmstudio", AL_API_OPENAI, "http://localhost:1234/v1", "local", NULL},
};

const struct al_provider *al_provider_hosted(enum al_api api)
{
    return api == AL_API_ANTHROPIC ? &hosted[1] : api == AL_API_RESPONSES ? &hosted[2] : &hosted[0];
}

static const char *const api_names[] = {
    [AL_API_OPENAI] = "openai", [AL_API_ANTHROPIC] = "anthropic", [AL_API_RESPONSES] = "responses"};

const char *al_api_name(enum al_api api)
{
    return (unsigned)api < sizeof(api_names) / sizeof(api_names[0]) ? api_names[api] : "?";
}

int al_api_parse(const char *name)
{
    for (size_t i = 0; name && i < sizeof(api_names) / sizeof(api_names[0]); i++)
        if (!strcmp(api_names[i], name))
            return (int)i;
    return -1;
}

const struct al_provider *al_provider_local(const char *name)
{
    for (size_t i = 0; name && i < sizeof(local) / sizeof(local[0]); i++)
        if (!strcmp(local[i].name, name))
            return &local[i];
    return NULL;
}
