/* Another preloaded library that interposes dlsym and dlclose, as tracers and profilers do:
 * its definitions are unversioned, and it reaches glibc's by symbol version. It counts the
 * lookups it sees and keeps the handle last closed, and answers the lookup of
 * "shim_dlsym_calls" and "shim_last_closed" (names it does not export) with them, so a program
 * can tell whether its calls went through it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

static long dlsym_calls;
static void *last_closed;

static void *glibc(const char *name)
{
    void *f = dlvsym(RTLD_NEXT, name, "GLIBC_2.34");
    return f ? f : dlvsym(RTLD_NEXT, name, "GLIBC_2.2.5");
}

void *dlsym(void *handle, const char *name)
{
    static void *(*real)(void *, const char *);
    if (!real)
        real = (void *(*)(void *, const char *))glibc("dlsym");
    dlsym_calls++;
    if (strcmp(name, "shim_dlsym_calls") == 0)
        return &dlsym_calls;
    if (strcmp(name, "shim_last_closed") == 0)
        return &last_closed;
    return real(handle, name);
}

int dlclose(void *handle)
{
    static int (*real)(void *);
    if (!real)
        real = (int (*)(void *))glibc("dlclose");
    last_closed = handle;
    return real(handle);
}
