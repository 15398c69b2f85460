"""A Python program that loads a CUDA-using extension module RTLD_LOCAL, as PyTorch does.

usage: framework_test.py LIBFRAMEWORK STEPS
Prints "program mallocs N" and "real mallocs M"."""
import ctypes
import os
import sys

lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
steps = int(sys.argv[2])
lib.fw_train_steps.argtypes = [ctypes.c_int, ctypes.c_size_t]
lib.fw_real_mallocs.restype = ctypes.c_ulonglong
status = lib.fw_train_steps(steps, 3 << 20)
if status != 0:
    sys.exit(f"fw_train_steps failed with {status}")
print(f"program mallocs {steps}")
print(f"real mallocs {lib.fw_real_mallocs()}")
