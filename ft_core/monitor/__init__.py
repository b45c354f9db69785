"""The node monitor: one process per node that watches every local rank and kills hung ones.

Its modules (the server's event loop, one rank's rules, the defences against bad peers, the handlers,
slow storage, a hung rank's path, the monitor process, the standalone entry) are listed, each with
its one job, in the generated layout table of ``docs/development.md``.

Usable without the launcher::

    proc = RankMonitorServer.run_in_subprocess(cfg, os.path.join(tempfile.mkdtemp(), "monitor.sock"))
    os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = proc.socket_path   # children inherit
    ...
    proc.stop()

The names are resolved on first use (PEP 562): importing the standalone entry
in a rank does not import the server. Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ft_core.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from ft_core.event_file import read_events
    from ft_core.jobdir import stack_dump_dir
    from ft_core.monitor.server import RankMonitorServer
    from ft_core.monitor.spawn import MonitorProcess

#: public name -> the module that owns it (``read_events`` and ``stack_dump_dir`` stay importable from here).
_EXPORTS = {
    "MonitorProcess": "ft_core.monitor.spawn",
    "RankMonitorServer": "ft_core.monitor.server",
    "read_events": "ft_core.event_file",
    "stack_dump_dir": "ft_core.jobdir",
}

__all__ = ["MonitorProcess", "RankMonitorServer", "read_events", "stack_dump_dir"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
