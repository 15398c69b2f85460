"""torch.version: `cuda` is the CUDA version PyTorch was built with, None without CUDA."""
import os

cuda = None if os.environ.get("FAKE_TORCH_CPU") == "1" else "13.0"
hip = None
