/* Loads a plugin linked with -lgpupool (argv[1]), runs it and unloads it, three times, with
 * SIGUSR1 handled by the program (so the pool starts no dump thread that would keep it
 * loaded). The pool must outlive the plugin: its cache and its blocks stay the program's, not
 * a new pool per load with the old one's segments leaked. Prints the
 * simulator's live bytes after each cycle: "cycle N live_mib M". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>

#include "check.h"

static void on_usr1(int sig)
{
    (void)sig;
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: plugin_host PLUGIN");
    CHECK(signal(SIGUSR1, on_usr1) != SIG_ERR, "signal");
    for (int i = 1; i <= 3; i++) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        CHECK(h != NULL, "dlopen: %s", dlerror());
        int (*run)(void) = (int (*)(void))dlsym(h, "plugin_run");
        CHECK(run != NULL && run() == 0, "plugin_run");
        CHECK(dlclose(h) == 0, "dlclose");
        cudasimStats st;
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        CHECK(cudasimGetStats(0, &st) == 0, "cudasimGetStats");
        printf("cycle %d live_mib %llu\n", i, st.live_bytes >> 20);
    }
    return 0;
}
