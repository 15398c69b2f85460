/* A program that opens libgpupool itself with dlopen (RTLD_LOCAL, as Python's ctypes and
 * PyTorch's pluggable allocator open it), with no CUDA runtime loaded, then reads dlerror():
 * after a dlopen that succeeded it must say nothing, as after any other library's.
 *
 * usage: dlopen_dlerror LIBRARY     prints "dlerror=(none)" or "dlerror=MESSAGE" */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: dlopen_dlerror LIBRARY\n");
        return 2;
    }
    dlerror();
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    const char *error = dlerror();
    printf("dlerror=%s\n", error ? error : "(none)");
    return 0;
}
