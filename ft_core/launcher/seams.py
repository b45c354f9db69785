"""The torch elastic seams ``ft_launcher`` builds on, checked when it starts.

``ft_launcher`` extends torch's ``LocalElasticAgent`` at its template-method
seams and reaches into a few private names of torch elastic (see
``agent.py``, ``cli.py``, ``coordination.py``, ``launch.py``, ``process.py``).
Torch does not promise to keep them, so the project declares no upper bound on
torch and instead checks, before anything of the launcher is imported, that
every one of them exists with the shape used. A torch that moved one stops
the launcher with one :class:`TorchSeamsError` naming the torch version, the
missing pieces and the tested versions, instead of a launcher that fails or
misbehaves later. Nothing else of the project depends on a torch version.

Example::

    >>> from ft_core.launcher.seams import missing_seams
    >>> missing_seams()  # the torch of this environment has every seam
    []

Names whose absence breaks nothing (torch's ``get_method_name``, which
:mod:`ft_core.launcher.rendezvous.records` only speeds up) are not checked. Attributes that
exist only on instances are checked on the launcher's own agent and
rendezvous handler once they are built (:func:`require_instance_attributes`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Iterable
from typing import Any, Optional

from ft_core.version import torch_version

__all__ = [
    "AGENT_INSTANCE_ATTRIBUTES",
    "RENDEZVOUS_INSTANCE_ATTRIBUTES",
    "SEAMS",
    "TESTED_TORCH",
    "Seam",
    "TorchSeamsError",
    "missing_seams",
    "require_instance_attributes",
    "require_torch_seams",
]

#: The torch minors CI runs on (README "Installing": the tested matrix): 2.13 the whole suite, 2.14 the
#: launcher, seam and integration tests and the wheel install, 2.12 (the declared lowest) the seams.
TESTED_TORCH = ("2.12", "2.13", "2.14")

_AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent"
_MP_API = "torch.distributed.elastic.multiprocessing.api"
_DYNAMIC_RDZV = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


@dataclasses.dataclass(frozen=True)
class Seam:
    """``module.name`` must exist; if ``params`` is given, it is callable and its parameters start with them.

    ``keywords`` are parameters it must accept by name, wherever they are
    (the fields of torch's ``LaunchConfig`` and ``WorkerSpec`` the launcher fills in).
    """

    module: str
    name: str
    #: Leading parameter names (``self`` excluded) the launcher's overrides and calls rely on.
    params: Optional[tuple[str, ...]] = None
    keywords: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.module}.{self.name}"

    def problem(self) -> Optional[str]:
        """Why this seam is not usable on the installed torch, or None if it is."""
        try:
            obj: Any = importlib.import_module(self.module)
        except ImportError as exc:
            return f"{self.module} cannot be imported ({exc})"
        for part in self.name.split("."):
            if not hasattr(obj, part):
                return f"{self.label} is gone"
            obj = getattr(obj, part)
        if self.params is None and not self.keywords:
            return None
        if not callable(obj):
            return f"{self.label} is not callable"
        try:
            params = [name for name in inspect.signature(obj).parameters if name != "self"]
        except (TypeError, ValueError):  # a builtin without a signature: nothing to compare
            return None
        if self.params is not None and tuple(params[: len(self.params)]) != self.params:
            return f"{self.label}({', '.join(params)}) changed shape: expected ({', '.join(self.params)}, ...)"
        absent = [name for name in self.keywords if name not in params]
        if absent:
            return f"{self.label} has no parameter(s) {', '.join(absent)}"
        return None


def _agent(name: str, *params: str) -> Seam:
    return Seam(_AGENT, f"LocalElasticAgent.{name}", params)


#: Every module-level and class-level name of torch the launcher imports, overrides or calls.
SEAMS: tuple[Seam, ...] = (
    # cli.py: torchrun's command line
    Seam("torch.distributed.run", "get_args_parser", ()),
    Seam("torch.distributed.run", "config_from_args", ("args",)),
    Seam("torch.distributed.run", "parse_min_max_nnodes", ("nnodes",)),
    # launch.py: what torch's launch_agent does, done by us
    Seam("torch.distributed.launcher.api", "LaunchConfig", keywords=(
        "min_nodes", "max_nodes", "nproc_per_node", "logs_specs", "run_id", "role", "rdzv_endpoint",
        "rdzv_backend", "rdzv_configs", "max_restarts", "monitor_interval", "start_method",
        "log_line_prefix_template", "metrics_cfg", "local_addr", "event_log_handler", "numa_options",
        "signals_to_handle", "duplicate_stdout_filters", "duplicate_stderr_filters", "virtual_local_rank",
        "shutdown_timeout")),
    Seam("torch.distributed.launcher.api", "_get_addr_and_port", ("rdzv_parameters",)),
    Seam("torch.distributed.elastic.metrics", "initialize_metrics", ()),
    Seam("torch.distributed.elastic.metrics", "MetricsConfig"),
    Seam("torch.distributed.elastic.metrics", "put_metric", ("metric_name", "metric_value")),
    Seam("torch.distributed.elastic.rendezvous", "RendezvousParameters"),
    Seam("torch.distributed.elastic.rendezvous.registry", "get_rendezvous_handler", ("params",)),
    Seam("torch.distributed.elastic.rendezvous.api", "RendezvousClosedError"),
    Seam("torch.distributed.elastic.rendezvous.api", "RendezvousGracefulExitError"),
    Seam("torch.distributed.elastic.agent.server.api", "WorkerSpec", keywords=(
        "role", "local_world_size", "rdzv_handler", "entrypoint", "args", "max_restarts", "monitor_interval",
        "master_port", "master_addr", "local_addr", "event_log_handler", "numa_options",
        "duplicate_stdout_filters", "duplicate_stderr_filters", "virtual_local_rank")),
    Seam("torch.distributed.elastic.agent.server.api", "WorkerGroup"),
    Seam("torch.distributed.elastic.agent.server.api", "WorkerState"),
    Seam("torch.distributed.elastic.agent.server.api", "RunResult"),
    Seam("torch.distributed.elastic.agent.server.api", "DEFAULT_ROLE"),
    Seam("torch.distributed.elastic.multiprocessing", "SignalException"),
    Seam("torch.distributed.elastic.multiprocessing", "DefaultLogsSpecs"),
    # agent.py: LocalElasticAgent's constructor and template methods
    Seam(_AGENT, "LocalElasticAgent", ("spec", "logs_specs"),
         keywords=("start_method", "log_line_prefix_template", "shutdown_timeout")),
    _agent("_rendezvous", "worker_group"),
    _agent("_set_local_rank_env", "worker_env", "local_rank", "spec"),
    _agent("_start_workers", "worker_group"),
    _agent("_stop_workers", "worker_group"),
    _agent("_monitor_workers", "worker_group"),
    _agent("_invoke_run", "role"),
    _agent("_initialize_workers", "worker_group"),
    _agent("_restart_workers", "worker_group"),
    _agent("_exit_barrier"),
    _agent("_shutdown", "death_sig", "timeout"),
    # process.py: the worker handler factory and its Popen
    Seam(_MP_API, "get_subprocess_handler",
         ("entrypoint", "args", "env", "stdout", "stderr", "local_rank_id", "numa_options")),
    Seam("torch.distributed.elastic.multiprocessing.subprocess_handler", "SubprocessHandler._popen",
         ("args", "env")),
    Seam(_MP_API, "SubprocessContext.close", ("death_sig", "timeout")),
    Seam(_MP_API, "SubprocessContext.pids", ()),
    # coordination.py: leaving a rendezvous without closing it, counting hot spares
    Seam(_DYNAMIC_RDZV, "DynamicRendezvousHandler"),
    Seam(_DYNAMIC_RDZV, "_RendezvousExitOp"),
    Seam(_DYNAMIC_RDZV, "DynamicRendezvousHandler._stop_heartbeats", ()),
    Seam(_DYNAMIC_RDZV, "_BackendRendezvousStateHolder.sync", ()),
    # rendezvous/wake.py: torch's poll sleep replaced by a wait for the state's next phase
    Seam(_DYNAMIC_RDZV, "_BackendRendezvousStateHolder", ("backend", "settings", "cache_duration")),
    Seam(_DYNAMIC_RDZV, "_BackendRendezvousStateHolder._sanitize", ()),
    Seam(_DYNAMIC_RDZV, "_remove_participant_epilogue", ("state", "settings")),
    Seam(_DYNAMIC_RDZV, "_delay", ("seconds",)),
    Seam(_DYNAMIC_RDZV, "_RendezvousState", ()),
    # rendezvous/members_first.py: the join operation's decision, held back while the last round's members rejoin
    Seam(_DYNAMIC_RDZV, "_DistributedRendezvousOpExecutor.run", ("state_handler", "deadline", "update_deadline")),
    Seam(_DYNAMIC_RDZV, "_RendezvousJoinOp"),
    Seam(_DYNAMIC_RDZV, "_Action"),
    Seam(_DYNAMIC_RDZV, "_should_keep_alive", ("ctx",)),
    Seam("torch.distributed.elastic.rendezvous.c10d_rendezvous_backend", "C10dRendezvousBackend"),
    Seam("torch.distributed", "TCPStore.clone"),
)

#: Attributes ``FtElasticAgent`` reads or sets on itself (set by ``LocalElasticAgent.__init__``).
AGENT_INSTANCE_ATTRIBUTES = ("_pcontext", "_remaining_restarts", "_worker_group")
#: Attributes read on a ``DynamicRendezvousHandler`` (c10d, etcd-v2) and its state holder.
RENDEZVOUS_INSTANCE_ATTRIBUTES = ("_store", "_state_holder", "_op_executor", "settings",
                                  "_state_holder._last_sync_time", "_state_holder.state.redundancy_list",
                                  "_state_holder._backend", "_state_holder._settings", "_state_holder._cache_duration",
                                  "_state_holder._token", "_state_holder._dirty", "_state_holder.state.round",
                                  "_state_holder.state.complete", "_op_executor._state_holder", "_op_executor.run",
                                  "_state_holder.state.participants", "_state_holder.state.wait_list",
                                  "_state_holder.state.last_heartbeats", "_this_node", "_state_holder._state")


class TorchSeamsError(RuntimeError):
    """The installed torch lacks pieces of torch elastic the launcher is built on.

    The message names the torch version, every missing piece and the tested torch versions.
    """

    def __init__(self, problems: Iterable[str], version: Optional[str] = None) -> None:
        self.problems = list(problems)
        self.torch_version = version if version is not None else torch_version()
        listed = "".join(f"\n  - {problem}" for problem in self.problems)
        super().__init__(
            f"ft_launcher cannot run on torch {self.torch_version}: torch elastic changed "
            f"({len(self.problems)} missing piece(s)):{listed}\n"
            f"ft_launcher is tested with torch {', '.join(TESTED_TORCH)}; install one of those "
            "(pip install 'torch==2.14.*') or an ft-suite-pytorch release that supports this torch. "
            "The rank client, the monitor and the integrations do not depend on the torch version.")


def missing_seams(seams: Iterable[Seam] = SEAMS) -> list[str]:
    """What is wrong with the installed torch's seams, one sentence each; empty when all are there."""
    return [problem for problem in (seam.problem() for seam in seams) if problem is not None]


def require_torch_seams() -> None:
    """Raise :class:`TorchSeamsError` unless every seam of :data:`SEAMS` is usable."""
    problems = missing_seams()
    if problems:
        raise TorchSeamsError(problems)


def require_instance_attributes(obj: Any, names: Iterable[str]) -> None:
    """Raise :class:`TorchSeamsError` if ``obj`` lacks one of the (dotted) attribute ``names``."""
    problems = []
    for dotted in names:
        current = obj
        for part in dotted.split("."):
            if not hasattr(current, part):
                problems.append(f"{type(obj).__module__}.{type(obj).__qualname__} instances have no {dotted}")
                break
            current = getattr(current, part)
    if problems:
        raise TorchSeamsError(problems)
