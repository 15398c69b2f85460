"""A stand-in for torch, as far as gpupool.torch uses it: torch.device and torch.cuda."""
from . import cuda


class device:
    """torch.device("cuda:1") and torch.device("cuda"): a type and an optional index."""

    def __init__(self, spec: str) -> None:
        kind, _, index = spec.partition(":")
        self.type = kind
        self.index = int(index) if index else None
