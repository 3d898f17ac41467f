/* Cleanup attributes (GCC's and clang's cleanup), one copy for every C part of Airlock: the
 * guest agent, libairlock, airlockd and the tests (the three of them once had their own). A
 * variable marked _cleanup_free_ is freed, _cleanup_close_ closed, when it goes out of scope;
 * TAKE_PTR and al_take_fd hand the value on and leave nothing to clean. Include
 * <cjson/cJSON.h> before this header for _cleanup_cjson_. */
#ifndef AIRLOCK_CLEANUP_H
#define AIRLOCK_CLEANUP_H

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* Defines NAME(TYPE *p) that calls FUNC(*p) when *p is set: for _cleanup_ on a handle. */
#define AL_DEFINE_CLEANUP(name, type, func)                                                        \
    static inline void name(type *p)                                                               \
    {                                                                                              \
        if (*p)                                                                                    \
            func(*p);                                                                              \
    }
#define _cleanup_(f) __attribute__((cleanup(f)))

static inline void al_freep(void *p)
{
    free(*(void **)p);
}
/* Closes an fd that is open (>= 0), keeping errno: a cleanup never changes why a call failed. */
/* Closes *fd if open, and forgets it (-1): a stale number is never polled or closed again. */
static inline void al_closep(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
        *fd = -1;
    }
}
#define _cleanup_free_ _cleanup_(al_freep)
#define _cleanup_close_ _cleanup_(al_closep)

static inline void *al_steal(void *pp)
{
    void **p = (void **)pp;
    void *v = *p;
    *p = NULL;
    return v;
}
#define TAKE_PTR(p) ((__typeof__(p))al_steal(&(p)))
static inline int al_take_fd(int *fd)
{
    int v = *fd;
    *fd = -1;
    return v;
}

#ifdef cJSON__h
AL_DEFINE_CLEANUP(al_cjsonp, cJSON *, cJSON_Delete)
#define _cleanup_cjson_ _cleanup_(al_cjsonp)
#endif

#endif
