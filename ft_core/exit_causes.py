"""Why a worker ended, as its ``worker_exit`` record says (:class:`ExitCause`).

Torch-free: the event records (:mod:`ft_core.events`) and their readers (the
report, the metrics endpoint) import it.
"""

from __future__ import annotations

import enum
import signal
from typing import Optional

__all__ = ["ExitCause"]

#: The prefix of the causes of the workers a launcher stopped on a signal it received: ``launcher SIGTERM``.
_SIGNAL_STOP = "launcher "


class ExitCause(str, enum.Enum):
    """Why a worker ended (a ``worker_exit``'s ``cause``).

    Besides the members below, one per signal the launcher forwards: ``launcher SIGTERM``
    (:meth:`stopped_by`; whichever signals ``--signals-to-handle`` names, each has its member).
    """

    CRASH = "crash"  # it failed on its own (a fault)
    HANG = "hang"  # it failed after its monitor detected a hang (killed for it)
    FINISHED = "exit after training finished"  # it failed once training was finished: not a fault
    SIGTERM = _SIGNAL_STOP + "SIGTERM"  # the launcher received SIGTERM and forwarded it (SLURM's preemption)
    SIGINT = _SIGNAL_STOP + "SIGINT"

    @classmethod
    def stopped_by(cls, sig: signal.Signals) -> ExitCause:
        """The cause of a worker the launcher stopped on receiving ``sig``."""
        return cls(_SIGNAL_STOP + sig.name)

    @property
    def launcher_stop(self) -> bool:
        """The launcher stopped it on a signal it received: neither a fault nor the end of training."""
        return self.value.startswith(_SIGNAL_STOP)

    @classmethod
    def _missing_(cls, value: object) -> Optional[ExitCause]:
        # ``launcher <SIGNAL>`` for any signal torch's launcher may handle (``--signals-to-handle``): a member
        # made once per signal name, so that decoding and ``stopped_by`` agree on identity.
        if not isinstance(value, str) or not value.startswith(_SIGNAL_STOP) \
                or value[len(_SIGNAL_STOP):] not in signal.Signals.__members__:
            return None
        member = str.__new__(cls, value)
        member._name_, member._value_ = value[len(_SIGNAL_STOP):], value
        return cls._value2member_map_.setdefault(value, member)  # type: ignore[return-value]
