"""torch.cuda: the memory calls re-exported, as PyTorch's `from .memory import *` does."""
from . import memory
from .memory import *  # noqa: F401,F403


def current_device() -> int:
    return 0


class device:
    """torch.cuda.device(1), the context manager: its ordinal is `idx`."""

    def __init__(self, index: int) -> None:
        self.idx = index
