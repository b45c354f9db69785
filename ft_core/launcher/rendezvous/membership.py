"""Who is waiting to join torch's dynamic rendezvous, and how a node leaves it alone.

Torch's handler exposes only ``num_nodes_waiting()`` and a ``shutdown()`` that closes the
rendezvous for every node; hot spares (:func:`spares_waiting`), torch's scale-up rule at the
job's maximum (:func:`nodes_could_join`) and an excluded node's own exit
(:func:`leave_rendezvous`) read or run the handler's own state and operations.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["leave_rendezvous", "nodes_could_join", "spares_waiting"]


def spares_waiting(handler: Any) -> int:
    """Hot spares waiting in a dynamic rendezvous (0 for other backends): its redundancy and wait lists.

    Torch exposes only ``num_nodes_waiting()`` (the wait list); the redundancy list is in
    the handler's private state, which this reads after a fresh sync (bypassing the
    state holder's one-second cache, which may predate a spare's arrival). A node in the
    wait list is a spare too while the job is at its ``--nnodes`` maximum: torch moves a
    spare there when it syncs while a restarting node has left the round, and it joins
    the next round that has room (see :func:`nodes_could_join`).
    """
    holder = getattr(handler, "_state_holder", None)
    if holder is None:
        return 0
    holder._last_sync_time = -1
    holder.sync()
    return len(holder.state.redundancy_list) + len(holder.state.wait_list)


def nodes_could_join(handler: Any, nodes: int) -> bool:
    """Torch's scale-up rule, where a waiting node could join: nodes wait and the round has room for them.

    Torch restarts a cycle whenever a node waits (``num_nodes_waiting() > 0``). A hot
    spare lands in the wait list when it syncs in the instant a restarting node has
    left the round (fewer participants than the maximum); at the job's ``--nnodes``
    maximum it can never be admitted, so that rule restarted the job again and again,
    each new round leaving the spare waiting (a livelock, every restart unbudgeted).
    At the maximum a waiting node is a spare: it takes a place when one is free.
    """
    max_nodes = getattr(getattr(handler, "settings", None), "max_nodes", None)
    if max_nodes is not None and nodes >= max_nodes:
        return False
    return bool(handler.num_nodes_waiting() > 0)


def leave_rendezvous(handler: Any) -> None:
    """Take this node out of a dynamic rendezvous without closing it for the other nodes.

    Torch offers ``shutdown()``, which closes the rendezvous for everyone; a
    node that is excluded must only remove itself so that the remaining nodes
    and a hot spare can form the next round at once (instead of waiting for
    this node's keep-alive to expire). There is no public API for that, so this
    runs the handler's own exit operation.
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        _RendezvousExitOp,
    )

    if not isinstance(handler, DynamicRendezvousHandler):
        return
    handler._stop_heartbeats()
    deadline = time.monotonic() + handler.settings.timeout.close.total_seconds()
    handler._op_executor.run(_RendezvousExitOp(), deadline)
