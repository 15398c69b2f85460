/* Every driver entry point the pool hooks, looked up with dlsym in the driver as XLA looks its
 * functions up: under the preload the answer must be the pool's own function of that name. The
 * hooks are swapped by the identity of the driver's function, through tables kept in one order
 * (src/cuda/hooked.rs, src/hooks/driver.rs): one out of order would hand out another name's
 * hook. A name this driver lacks is skipped.
 *
 * usage: driver_identity NAME...
 * Prints "mismatch NAME" for each name whose lookup is not the pool's function, then
 * "checked=N", "skipped=M" and "driver_identity ok" when none mismatched. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int checked = 0, skipped = 0, bad = 0;
    if (driver == NULL) {
        fprintf(stderr, "dlopen(libcuda.so.1): %s\n", dlerror());
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        void *found = dlsym(driver, argv[i]);
        if (found == NULL) {
            skipped++;
            continue;
        }
        /* The global scope's definition: the preloaded pool's export comes first. */
        void *own = dlsym(RTLD_DEFAULT, argv[i]);
        if (found != own) {
            printf("mismatch %s\n", argv[i]);
            bad++;
        }
        checked++;
    }
    printf("checked=%d\nskipped=%d\n", checked, skipped);
    if (bad)
        return 1;
    printf("driver_identity ok\n");
    return 0;
}
