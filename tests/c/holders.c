/* Who holds the memory: the program allocates one 2 MiB block itself, then loads the two
 * libraries named in argv (RTLD_LOCAL, as Python loads extensions) and has the first allocate
 * three 1 MiB blocks through the runtime and the second two 4 MiB blocks through the driver.
 * Nothing is freed: the exit summary lists what each library holds. */
#include "check.h"

#include <dlfcn.h>

static int call(const char *path, const char *name, int n)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    int (*f)(int);
    CHECK(h != NULL, "dlopen %s: %s", path, dlerror());
    *(void **)&f = dlsym(h, name);
    CHECK(f != NULL, "no %s in %s", name, path);
    return f(n);
}

int main(int argc, char **argv)
{
    void *own = NULL;
    CHECK(argc == 3, "usage: holders RUNTIME_LIB DRIVER_LIB");
    CHECK_CUDA(cudaMalloc(&own, 2 << 20));
    CHECK(call(argv[1], "hold_runtime", 3) == 3, "hold_runtime");
    CHECK(call(argv[2], "hold_driver", 2) == 2, "hold_driver");
    printf("holders: all checks passed\n");
    return 0;
}
