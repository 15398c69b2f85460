"""A stand-in for torch, as far as gpupool.torch uses it: torch.device, torch.version and
torch.cuda. FAKE_TORCH_CPU=1 makes it a build without CUDA, as `pip install torch --index-url
.../cpu` gives: torch.version.cuda is None and the CUDA bindings are missing."""
import os

from . import cuda, version

__version__ = "2.11.0+cpu" if os.environ.get("FAKE_TORCH_CPU") == "1" else "2.11.0+cu130"


class device:
    """torch.device("cuda:1") and torch.device("cuda"): a type and an optional index."""

    def __init__(self, spec: str) -> None:
        kind, _, index = spec.partition(":")
        self.type = kind
        self.index = int(index) if index else None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"
