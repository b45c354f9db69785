"""Where the in-process store comes from: the factory that connects every rank and watchdog to it.

The in-process store is the ``torch.distributed.Store`` the ranks of in-process restart
share; :mod:`.restart_records` keeps its records in it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Optional, Protocol

from ft_core.utils.validation import ValidationError, int_in_range

if TYPE_CHECKING:
    import torch.distributed

__all__ = ["StoreFactory", "TCPStoreFactory"]

#: Environment variable naming the port of the in-process store.
STORE_PORT_ENV = "FT_INPROCESS_STORE_PORT"


class StoreFactory(Protocol):
    """Connects to the in-process store (injectable through ``Wrapper(store_factory=...)``).

    Called in every rank and in every watchdog process; ``host`` is True only in
    the process that should serve the store if anyone must (initial rank 0).
    A factory must be picklable by reference (defined at module level in an
    importable module): it is sent to the watchdog processes.
    """

    def __call__(self, *, host: bool, timeout: float) -> torch.distributed.Store: ...


@dataclass(frozen=True)
class TCPStoreFactory:
    """A ``torch.distributed.TCPStore`` at ``host_name:port``, keys below ``prefix``.

    Defaults come from the environment when the factory is resolved:

    * ``host_name``: ``MASTER_ADDR``;
    * ``port``: ``FT_INPROCESS_STORE_PORT`` if set; else, under torchrun (or
      ``ft_launcher``) with ``TORCHELASTIC_USE_AGENT_STORE=True``, the agent's
      own store at ``MASTER_PORT`` (it outlives every worker, so losing rank 0
      is recoverable too); else ``MASTER_PORT + 1``, served by initial rank 0
      (``MASTER_PORT`` itself is left to ``init_process_group``);
    * ``prefix``: ``ft_inprocess/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>``,
      a fresh namespace for every launcher restart cycle;
    * ``serve``: whether initial rank 0 serves the store; True unless the
      agent's store is used (set False for a store you serve yourself).
    """

    host_name: Optional[str] = None
    port: Optional[int] = None
    prefix: Optional[str] = None
    serve: Optional[bool] = None

    def resolve(self) -> TCPStoreFactory:
        """The same factory with every default read from the environment, ready to be pickled."""
        env = os.environ
        host_name = self.host_name or env.get("MASTER_ADDR")
        if not host_name:
            raise ValidationError("TCPStoreFactory.host_name", self.host_name, "a host name",
                                  problem="host_name=None and MASTER_ADDR is not set")
        port, serve = self.port, self.serve
        if port is None and env.get(STORE_PORT_ENV):
            port = _env_port(STORE_PORT_ENV, env[STORE_PORT_ENV])
        elif port is None and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            port = _env_port("MASTER_PORT", env.get("MASTER_PORT"))
            serve = False if serve is None else serve
        elif port is None:
            port = _env_port("MASTER_PORT", env.get("MASTER_PORT")) + 1
        prefix = self.prefix
        if prefix is None:
            run_id = env.get("TORCHELASTIC_RUN_ID", "none")
            prefix = f"ft_inprocess/{run_id}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        return TCPStoreFactory(host_name, port, prefix, True if serve is None else serve)

    def __call__(self, *, host: bool, timeout: float) -> torch.distributed.Store:
        import torch.distributed as dist

        resolved = self.resolve()
        # resolve() fills in every field or raises.
        assert resolved.host_name is not None and resolved.port is not None and resolved.prefix is not None
        store = dist.TCPStore(
            resolved.host_name,
            resolved.port,
            is_master=bool(host and resolved.serve),
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
        )
        return dist.PrefixStore(resolved.prefix, store)


def _env_port(name: str, value: Optional[str]) -> int:
    # At most 65534: the store of the default layout listens on MASTER_PORT + 1.
    return int_in_range(name, value, 1, 65534, coerce=True)
