"""Telling a faulty rank from its victims.

When one rank fails, its peers fail too, inside the collectives they were
running with it, often sooner than the faulty rank's own report reaches the
store. The first report of an attempt decides whom a fault is blamed on
(``FaultCounter`` retires ranks by it), so a rank whose failure happened
inside ``torch.distributed`` gives the others a moment to report first.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType, TracebackType
from typing import Optional

__all__ = ["main_thread_in_torch_distributed", "raised_in_torch_distributed"]


def _in_torch_distributed(frame: Optional[FrameType]) -> bool:
    return frame is not None and frame.f_globals.get("__name__", "").startswith("torch.distributed")


def main_thread_in_torch_distributed() -> bool:
    """Whether the main thread is (blocked) inside a ``torch.distributed`` call."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None:
        if _in_torch_distributed(frame):
            return True
        frame = frame.f_back
    return False


def raised_in_torch_distributed(exc: BaseException) -> bool:
    """Whether ``exc`` (or the exception it was raised while handling) came out of ``torch.distributed``."""
    current: Optional[BaseException] = exc
    while current is not None:
        tb: Optional[TracebackType] = current.__traceback__
        while tb is not None:
            if _in_torch_distributed(tb.tb_frame):
                return True
            tb = tb.tb_next
        current = current.__context__
    return False
