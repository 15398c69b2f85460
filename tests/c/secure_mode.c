/* A program that uses no CUDA and prints whether it runs in secure mode (AT_SECURE: set-user-ID,
 * set-group-ID, file capabilities): "secure 1" or "secure 0". Linked with -lgpupool, since the
 * dynamic linker preloads no library by path in secure mode. */
#include <stdio.h>
#include <sys/auxv.h>

int main(void)
{
    printf("secure %lu\n", getauxval(AT_SECURE));
    return 0;
}
