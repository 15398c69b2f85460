/* A library that holds nothing itself: it links holder_runtime.c's library, which the dynamic
 * linker loads with it and unloads with it, for the attribution test of a library unloaded as
 * another's dependency (tests/driver.rs). dlsym of "hold_runtime" on this library's handle finds
 * the dependency's function, so holders_unloaded.c drives it as it drives holder_runtime.c. */
int hold_runtime(int n);
int hold_through_wrapper(int n);

int hold_through_wrapper(int n)
{
    return hold_runtime(n);
}
