/* Who holds the memory when the library that allocated it is gone: loads the library named in
 * argv[1] (RTLD_LOCAL, as Python loads extensions), has it make three live 1 MiB blocks through
 * the runtime, and unloads it; then loads argv[2], another copy of the same library under
 * another name, which the dynamic linker usually maps where the first one was, and has it
 * allocate nothing. The blocks stay live to the end: the exit summary must name the first
 * library as their holder, not "unknown" nor the copy that took its place. Prints
 * "same_address=1" when the copy was mapped at the first library's address. */
#define _GNU_SOURCE
#include "check.h"

#include <dlfcn.h>

int main(int argc, char **argv)
{
    CHECK(argc == 3, "usage: holders_unloaded LIB COPY");
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen %s: %s", argv[1], dlerror());
    int (*hold)(int);
    *(void **)&hold = dlsym(h, "hold_runtime");
    CHECK(hold != NULL, "no hold_runtime in %s", argv[1]);
    CHECK(hold(3) == 3, "hold_runtime");
    Dl_info first;
    CHECK(dladdr((void *)hold, &first) != 0, "dladdr");
    void *first_base = first.dli_fbase;
    CHECK(dlclose(h) == 0, "dlclose: %s", dlerror());
    CHECK(dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) == NULL, "%s is still loaded", argv[1]);

    void *copy = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    CHECK(copy != NULL, "dlopen %s: %s", argv[2], dlerror());
    void *f = dlsym(copy, "hold_runtime");
    Dl_info second;
    CHECK(f != NULL && dladdr(f, &second) != 0, "dladdr of the copy");
    printf("same_address=%d\n", second.dli_fbase == first_base);
    printf("holders_unloaded: all checks passed\n");
    return 0;
}
