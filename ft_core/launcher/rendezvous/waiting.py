"""A status line while this node waits at the rendezvous, instead of minutes of silence.

``waiting for nodes: 1 of 2 joined, 30 s (c10d rendezvous, run 4242)`` every
:data:`STATUS_INTERVAL` seconds until the rendezvous completes (or fails). The joined
count is read from torch's dynamic rendezvous state, which the waiting thread keeps in
sync; other backends (``static``) say only how long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

__all__ = ["STATUS_INTERVAL", "reporting_rendezvous_wait"]

log = logging.getLogger("ft_core.launcher")

#: Seconds between two status lines while the rendezvous is not complete.
STATUS_INTERVAL = 30.0


def _joined(handler: Any) -> Optional[int]:
    """Nodes in the current round of a dynamic rendezvous (torch keeps them in private state), else None."""
    holder = getattr(handler, "_state_holder", None)
    state = getattr(holder, "state", None)
    participants = getattr(state, "participants", None)
    return None if participants is None else len(participants)


def _status(handler: Any, waited: float) -> str:
    joined = _joined(handler)
    min_nodes = getattr(getattr(handler, "settings", None), "min_nodes", None)
    count = f"{joined} of {min_nodes} joined, " if joined is not None and min_nodes is not None else ""
    return f"waiting for nodes: {count}{waited:.0f} s ({handler.get_backend()} rendezvous, run {handler.get_run_id()})"


@contextmanager
def reporting_rendezvous_wait(handler: Any, interval: float = STATUS_INTERVAL) -> Iterator[None]:
    """Log :func:`_status` every ``interval`` seconds while the body (the rendezvous) runs."""
    done = threading.Event()
    started = time.monotonic()

    def report() -> None:
        while not done.wait(interval):
            log.info("%s", _status(handler, time.monotonic() - started))

    thread = threading.Thread(target=report, name="ft-rendezvous-wait", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
