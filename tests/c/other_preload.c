/* A program run with another library preloaded that interposes dlsym and dlclose
 * (other_preload_shim.c): prints what its lookups answer, what dlerror() reads after failed
 * ones (a driver name among them), how many of its lookups the other library saw and
 * whether it saw its dlclose. Uses no CUDA. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

static void lookup(void *handle, const char *what, const char *name)
{
    void *p = dlsym(handle, name);
    const char *e = dlerror();
    printf("%s %s: %s, dlerror: %s\n", what, name, p ? "found" : "NULL", e ? e : "(none)");
}

int main(void)
{
    void *libc = dlopen("libc.so.6", RTLD_NOW);
    lookup(RTLD_DEFAULT, "default", "no_such_symbol");
    lookup(RTLD_DEFAULT, "default", "cuNoSuchEntry");
    lookup(RTLD_NEXT, "next", "no_such_symbol");
    lookup(libc, "libc", "cuInit");
    lookup(libc, "libc", "getpid");
    printf("dlclose: %d\n", dlclose(libc));
    long *dlsym_calls = dlsym(RTLD_DEFAULT, "shim_dlsym_calls");
    void **last_closed = dlsym(RTLD_DEFAULT, "shim_last_closed");
    printf("the other library saw: %ld dlsym, %s\n", dlsym_calls ? *dlsym_calls : -1L,
           last_closed && *last_closed == libc ? "the dlclose" : "no dlclose");
    return 0;
}
