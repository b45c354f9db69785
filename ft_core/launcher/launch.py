"""Run one node of a job: start the per-node services, run the agent, tear everything down."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any, Optional, Union

from torch.distributed.elastic import metrics
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
from torch.distributed.launcher.api import LaunchConfig, _get_addr_and_port

from ft_core.config_loading import LoadedConfig
from ft_core.events import LauncherExit, LauncherStarted
from ft_core.jobdir import claim_job_dir, saved_stacks_dir
from ft_core.launcher.agent import FtElasticAgent
from ft_core.launcher.control import WorkloadControlServer
from ft_core.launcher.node_monitor import NodeMonitor
from ft_core.launcher.observability.event_log import EVENTS_FILE_NAME, EventLog
from ft_core.launcher.observability.metrics import SCRAPE_TARGETS_DIR, LauncherMetrics
from ft_core.launcher.options import LauncherOptions
from ft_core.launcher.outcome import Outcome, signal_outcome
from ft_core.launcher.rendezvous.etcd_v3 import register as register_etcd_v3
from ft_core.launcher.rendezvous.liveness import LostMembers, install_lost_members
from ft_core.launcher.rendezvous.members_first import install_members_first
from ft_core.launcher.rendezvous.records import use_cheap_method_names
from ft_core.launcher.rendezvous.slurm import job_id
from ft_core.launcher.rendezvous.wake import install_wake_on_change
from ft_core.launcher.seams import (
    AGENT_INSTANCE_ATTRIBUTES,
    RENDEZVOUS_INSTANCE_ATTRIBUTES,
    TorchSeamsError,
    require_instance_attributes,
)
from ft_core.launcher.services import Services
from ft_core.launcher.startup.head_start import HeadStart, adopt
from ft_core.launcher.startup.prewarm import WorkerFactory
from ft_core.monitor.status import status_path
from ft_core.snapshots.space import claim_snapshot_dir
from ft_core.utils.procutil import SIGNALS_TO_HANDLE_ENV, signals_named

__all__ = ["launch"]

log = logging.getLogger("ft_core.launcher")


def launch(config: LaunchConfig, entrypoint: Union[Callable, str], args: list[Any],
           loaded: LoadedConfig, options: LauncherOptions, *, head_start: Optional[HeadStart] = None) -> int:
    """Run this node's part of the job; returns the launcher's exit code (see "Exit codes" in ``docs/launcher.md``).

    ``loaded``: the fault tolerance config and the keys the user set (``--ft-*`` flags, ``--ft-cfg-path``
    keys), whole for the node monitor: a rank's fallback values fill in the others. ``head_start``: the worker factory and
    the monitor's process started before the launcher's imports (:mod:`ft_core.launcher.startup.head_start`); the factory is
    used if it fits the job, else stopped.
    """
    # The factory's environment is ours now, before the changes below (which concern the launcher only).
    factory = adopt(head_start.factory if head_start is not None else None,
                    WorkerFactory.for_job(entrypoint, args, options.prewarm_modules, config.numa_options)
                    if options.prewarm else None)
    events = EventLog(options.events_file or _default_events_path(config))
    log.info("fault tolerance event log: %s", events.path)
    # Mode 0700, unpredictable, locked while we run; job dirs of SIGKILLed launchers are removed first.
    claim = claim_job_dir()
    job_dir = claim.job_dir
    # The in-memory snapshots' directory in /dev/shm: the same name, lock and lifetime (None: no snapshots).
    snapshots = claim_snapshot_dir(job_dir)
    token = secrets.token_hex(16)
    monitor = NodeMonitor(loaded, job_dir, token, stacks_dir=saved_stacks_dir(events.path),
                          standby=head_start.monitor if head_start is not None else None)
    control = None
    agent = None
    lost_members: LostMembers | None = None
    prometheus: LauncherMetrics | None = None
    outcome = Outcome(1, "the launcher failed before the job started")
    # Workers get a fresh store per cycle from FtElasticAgent, so torch's shared rendezvous store
    # server is not needed; with it, a node that joins later (a hot spare) waits forever for
    # MASTER_ADDR, which torch publishes only in the first round of the group rank 0 node.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Until the first workers exist, SIGTERM/SIGINT must still end us through SignalException.
    os.environ[SIGNALS_TO_HANDLE_ENV] = config.signals_to_handle
    _install_signal_handlers(config.signals_to_handle)
    use_cheap_method_names()  # a restart's rendezvous would spend most of its time naming its records
    try:
        # The worker factory (unless it started before our imports) and the monitor start while the
        # agent does its first rendezvous; the agent waits for them just before it starts the workers.
        # The factory first: its imports are the longest wait.
        if factory is not None and not factory.started:
            factory.start()
        if options.metrics_port is not None:
            prometheus = LauncherMetrics(events, status_path(job_dir), job_id(config.run_id))
            events.observers.append(prometheus.observe)
            prometheus.start(options.metrics_port, options.metrics_targets_dir
                             or os.path.join(os.path.dirname(events.path), SCRAPE_TARGETS_DIR))
        monitor.start(wait=False)
        control = WorkloadControlServer(job_dir.launcher_socket, token, loaded.cfg.max_frame_bytes)
        events.write(LauncherStarted(
            run_id=config.run_id, min_nodes=config.min_nodes, max_nodes=config.max_nodes,
            nproc_per_node=config.nproc_per_node, max_restarts=config.max_restarts,
            rdzv_backend=config.rdzv_backend, monitor_pid=monitor.pid, config=loaded.cfg.to_dict()))
        services = Services(monitor, control, events, token, factory=factory,
                            on_straggler_round=prometheus.observe_round if prometheus is not None else None)
        spec = _worker_spec(config, entrypoint, args)
        if isinstance(spec.rdzv_handler, DynamicRendezvousHandler):
            require_instance_attributes(spec.rdzv_handler, RENDEZVOUS_INSTANCE_ATTRIBUTES)
            install_wake_on_change(spec.rdzv_handler, config.rdzv_configs)  # see .rendezvous.wake
            members_first = install_members_first(spec.rdzv_handler, config.rdzv_configs)  # .rendezvous.members_first
            lost_members = install_lost_members(spec.rdzv_handler, config.rdzv_configs)  # see .rendezvous.liveness
            if members_first is not None and lost_members is not None:
                members_first.lost_of = lost_members.marked_lost  # a spare does not wait for a member marked lost
        agent = FtElasticAgent(
            spec, config.logs_specs, services=services, options=options,
            start_method=config.start_method, log_line_prefix_template=config.log_line_prefix_template,
            shutdown_timeout=config.shutdown_timeout)
        require_instance_attributes(agent, AGENT_INSTANCE_ATTRIBUTES)
        metrics.initialize_metrics(metrics.MetricsConfig(config.metrics_cfg))
        agent.run()
        outcome = agent.outcome
    except SignalException as exc:
        if agent is not None and agent.decided:
            # The agent had ended (e.g. every worker succeeded) when the signal arrived, in torch's
            # bookkeeping after its loop: the verdict stands (a finished job must not be requeued).
            outcome = agent.outcome
        else:
            outcome = signal_outcome(exc.sigval, "before any worker started")
    except TorchSeamsError as exc:  # the one clear message, no traceback: the torch in use is the problem
        log.error("%s", exc)
        outcome = Outcome(1, f"torch {exc.torch_version} lacks torch elastic seams: {'; '.join(exc.problems)}")
    except Exception as exc:  # noqa: BLE001 - every failure must still tear down and report
        log.exception("ft_launcher failed: %s", exc)
        outcome = Outcome(1, f"launcher error: {type(exc).__name__}: {exc}")
    finally:
        _ignore_signals(config.signals_to_handle)  # teardown must finish
        if agent is not None:
            _release_rendezvous(agent, outcome)
        if lost_members is not None:
            lost_members.close()
        if control is not None:
            control.close()
        if prometheus is not None:
            prometheus.stop()
        if factory is not None:
            factory.close()
        monitor.stop()
        if snapshots is not None:
            snapshots.release()
        claim.release()
        events.write(LauncherExit(exit_code=outcome.exit_code, reason=outcome.reason))
        print(events.summary(outcome.exit_code, outcome.reason), file=sys.stderr, flush=True)
        events.close()
    return outcome.exit_code


def _worker_spec(config: LaunchConfig, entrypoint: Union[Callable, str], args: list[Any]) -> WorkerSpec:
    """The WorkerSpec torch's ``launch_agent`` builds for the same LaunchConfig."""
    rdzv_parameters = RendezvousParameters(
        backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id,
        min_nodes=config.min_nodes, max_nodes=config.max_nodes, local_addr=config.local_addr,
        **config.rdzv_configs)
    master_addr, master_port = _get_addr_and_port(rdzv_parameters)
    register_etcd_v3()  # --rdzv-backend=etcd-v3 beside torch's own backends
    return WorkerSpec(
        role=config.role, local_world_size=config.nproc_per_node, entrypoint=entrypoint, args=tuple(args),
        rdzv_handler=rdzv_registry.get_rendezvous_handler(rdzv_parameters), max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval, master_addr=master_addr, master_port=master_port,
        local_addr=config.local_addr, event_log_handler=config.event_log_handler,
        numa_options=config.numa_options, duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters, virtual_local_rank=config.virtual_local_rank)


def _default_events_path(config: LaunchConfig) -> str:
    root = config.logs_specs.root_log_dir if config.logs_specs is not None else os.devnull
    if root == os.devnull:
        root = tempfile.mkdtemp(prefix="ft_launcher_")
    return os.path.join(root, EVENTS_FILE_NAME)


def _release_rendezvous(agent: FtElasticAgent, outcome: Outcome) -> None:
    try:
        agent.release_rendezvous(outcome)
    except Exception as exc:  # noqa: BLE001 - the store host may already be gone at the end of a job
        log.warning("could not release the rendezvous: %s", exc)


def _raise_signal_exception(signum: int, _frame: Any) -> None:
    sig = signal.Signals(signum)
    raise SignalException(f"ft_launcher (pid {os.getpid()}) got {sig.name}", sigval=sig)


def _install_signal_handlers(names: str) -> None:
    for sig in signals_named(names):
        signal.signal(sig, _raise_signal_exception)


def _ignore_signals(names: str) -> None:
    for sig in signals_named(names):
        signal.signal(sig, signal.SIG_IGN)
