/* libairlock: when to take a checkpoint (policy.c). Beside airlock.h, by subject: heuristics
 * over the code a model wrote, which a front uses to decide and to warn; nothing in the core
 * relies on them. Same conventions as airlock.h; exported in the same version nodes. */
#ifndef AIRLOCK_POLICY_H
#define AIRLOCK_POLICY_H

#include <airlock.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

enum al_checkpoint_policy {
    AL_CHECKPOINT_AUTO = 0,   /* before every run except those proven read-only */
    AL_CHECKPOINT_ALWAYS = 1, /* before every run */
    AL_CHECKPOINT_NEVER = 2,
};
/* "auto", "always", "never". */
int al_checkpoint_policy_parse(const char *s, enum al_checkpoint_policy *out, al_error *err);
const char *al_checkpoint_policy_name(enum al_checkpoint_policy p);
/* Whether to take a checkpoint before running code in lang ("sh", "shell", "bash", "python",
 * "javascript", "node"; NULL or "" for a command line) under policy. */
bool al_checkpoint_policy_wants(const char *lang, const char *code,
                                enum al_checkpoint_policy policy);
/* True only when a conservative reading shows the code changes nothing in the guest: no file,
 * process or variable. Anything it is not sure about is not read-only. */
bool al_code_read_only(const char *lang, const char *code);
/* A short phrase when the code looks destructive ("recursive rm", "package manager"), else
 * NULL. A heuristic for telling the user; the policy never relies on it alone. */
const char *al_code_destructive(const char *lang, const char *code);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
