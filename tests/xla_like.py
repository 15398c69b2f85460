"""The driver reached as XLA reaches it: from a Python extension-like module loaded with
RTLD_LOCAL (tests/c/driver_module.c, whose module_churn() opens libcuda.so.1 itself and takes the
versioned entry points with dlsym). Prints module_driver_mallocs=N (100 alloc/free/sync rounds:
how many reached the driver's allocator) and "xla_like ok".

usage: python3 xla_like.py MODULE"""

import ctypes
import os
import sys


def main():
    module = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
    module.module_churn.restype = ctypes.c_long
    n = module.module_churn()
    if n < 0:
        print("module_churn failed", file=sys.stderr)
        return 1
    print(f"module_driver_mallocs={n}")
    print("xla_like ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
