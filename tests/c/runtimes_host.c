/* Loads each module given (runtime_module.c built against different runtimes) RTLD_LOCAL, as
 * Python loads extension modules, and runs it: the first with memory from cudaMalloc, the
 * others without, after its refused launch. Prints "MODULE: module_run -> STATUS" and
 * "MODULE: module_refused -> CODES" for each; exits 1 if a module_run failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("dlopen %s: %s\n", argv[i], dlerror());
            return 2;
        }
        int (*run)(int) = (int (*)(int))dlsym(h, "module_run");
        if (!run) {
            printf("no module_run in %s\n", argv[i]);
            return 2;
        }
        /* First the refused launch: the first launch of the module's kernel. */
        int (*refused)(void) = (int (*)(void))dlsym(h, "module_refused");
        if (refused)
            printf("%s: module_refused -> %d\n", argv[i], refused());
        int r = run(i == 1);
        printf("%s: module_run -> %d\n", argv[i], r);
        failed |= r != 0;
    }
    return failed;
}
