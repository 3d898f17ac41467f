/* A finished reply: freeing it, and turning it into a neutral conversation message. */
#include "model-internal.h"

#include <string.h>

void al_model_reply_free(al_model_reply *r)
{
    if (!r)
        return;
    free(r->text);
    for (size_t i = 0; i < r->ncalls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
        free(r->calls[i].kind);
    }
    free(r->calls);
    free(r->output);
    *r = (al_model_reply){0};
}

cJSON *al_model_args_object(const char *text)
{
    cJSON *o = cJSON_Parse(text);
    if (cJSON_IsObject(o))
        return o;
    cJSON_Delete(o);
    o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "_raw", text)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

char *al_model_args_text(const cJSON *arguments)
{
    /* What the model wrote, when it was not a JSON object: give it back unchanged. */
    const cJSON *raw = cJSON_GetObjectItemCaseSensitive(arguments, "_raw");
    if (cJSON_IsString(raw) && cJSON_GetArraySize(arguments) == 1)
        return strdup(raw->valuestring);
    if (cJSON_IsString(arguments))
        return strdup(arguments->valuestring);
    if (!arguments)
        return strdup("{}");
    return cJSON_PrintUnformatted(arguments);
}

cJSON *al_model_reply_message(const al_model_reply *r)
{
    _cleanup_cjson_ cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", "assistant") ||
        !cJSON_AddStringToObject(m, "content", r->text ? r->text : ""))
        return NULL;
    if (r->output) {
        cJSON *items = cJSON_Parse(r->output);
        if (!cJSON_IsArray(items) || !cJSON_AddItemToObject(m, "responses_output", items))
            return cJSON_Delete(items), NULL;
    }
    if (!r->ncalls)
        return TAKE_PTR(m);
    cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
    if (!calls)
        return NULL;
    for (size_t i = 0; i < r->ncalls; i++) {
        cJSON *c = cJSON_CreateObject();
        if (!c || !cJSON_AddItemToArray(calls, c))
            return cJSON_Delete(c), NULL;
        cJSON *args = al_model_args_object(r->calls[i].arguments ? r->calls[i].arguments : "");
        if (!cJSON_AddStringToObject(c, "id", r->calls[i].id ? r->calls[i].id : "") ||
            !cJSON_AddStringToObject(c, "name", r->calls[i].name ? r->calls[i].name : "") ||
            !args || !cJSON_AddItemToObject(c, "arguments", args))
            return cJSON_Delete(args), NULL;
        if (r->calls[i].kind && !cJSON_AddStringToObject(c, "kind", r->calls[i].kind))
            return NULL;
    }
    return TAKE_PTR(m);
}
