"""Python, PyTorch, its CUDA and the libcudart it loaded, for gpu-check's environment section."""

import sys

import torch

print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda_available", torch.cuda.is_available())
if torch.cuda.is_available():
    torch.zeros(1, device="cuda")
    print("device", torch.cuda.get_device_name(0))
    maps = open("/proc/self/maps").read().splitlines()
    libs = sorted({l.split()[-1] for l in maps if "libcudart" in l})
    print("torch_libcudart", " ".join(libs) or "none (static?)")
