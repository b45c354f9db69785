"""Torch's random skew before a node's first rendezvous join, skipped where it spreads no load.

Torch's c10d rendezvous (``DynamicRendezvousHandler.next_rendezvous``) sleeps
a random 0-0.3 s before joining while its round is 0, so that many nodes
starting together do not reach the store all at once. The round is still 0
at the first *restart*, so torch sleeps there too (0.15 s on average, most of
a restart's time), although the nodes then rejoin together anyway and torch's
later restarts do not sleep; and a job of one node has nobody to spread out.

:func:`join_skew_skipped` skips that sleep (the one ``_delay`` call torch makes
with a random range) for the rendezvous it wraps; torch's other waits, its 1 s
poll while it waits for other nodes, are :mod:`ft_core.launcher.rendezvous.wake`'s. A torch
without the helper is left as it is.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Union

__all__ = ["join_skew_skipped"]

log = logging.getLogger("ft_core.launcher")


@contextlib.contextmanager
def join_skew_skipped(skip: bool = True) -> Iterator[None]:
    """Within this block (if ``skip``), torch's dynamic rendezvous joins without its random first-round sleep."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = getattr(dynamic_rendezvous, "_delay", None)
    if not skip or not callable(original):
        yield
        return

    def delay(seconds: Union[float, tuple[float, float]], *args: Any, **kwargs: Any) -> None:
        if isinstance(seconds, tuple):  # the random skew; fixed waits (a poll interval) still sleep
            return
        original(seconds, *args, **kwargs)

    dynamic_rendezvous._delay = delay
    try:
        yield
    finally:
        dynamic_rendezvous._delay = original
