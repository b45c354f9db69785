"""Built-in ``abort`` hooks: make blocked communication return so the rank can restart."""

from __future__ import annotations

import logging

from .hook_context import State

__all__ = ["AbortTorchDistributed"]

log = logging.getLogger("ft_core.inprocess")


class AbortTorchDistributed:
    """Abort and destroy every ``torch.distributed`` process group of this rank.

    Runs in the watchdog thread while the main thread may still be inside a
    collective. With NCCL the abort makes pending collectives return at once.
    Gloo cannot cancel an operation the local rank is blocked in, but aborting
    closes this rank's connections, so *peers* blocked on this rank get an
    error immediately; a rank blocked on a peer that cannot abort (stuck in C
    code) is released when the peer's watchdog process terminates it (hard
    timeout).
    """

    def __call__(self, state: State) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        abort_all = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort_all is not None:
            try:
                abort_all()  # also forgets every group, like destroy_process_group()
                return
            except Exception as exc:  # backend without abort support: destroying is the fallback
                log.debug("rank %d: abort of process groups failed (%s); destroying them", state.initial_rank, exc)
        if dist.is_initialized():
            dist.destroy_process_group()
