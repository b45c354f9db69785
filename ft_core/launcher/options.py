"""ft_launcher's own flags (beyond torchrun's and the ``--ft-<field>`` config flags), and the settings
the launcher takes from :class:`~ft_core.config.FaultToleranceConfig` (the no-progress rule)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from typing import Annotated, Optional

import msgspec

from ft_core.config import FaultToleranceConfig
from ft_core.jobdir import LAUNCHER_EVENTS_FILE
from ft_core.launcher.outcome import DEFAULT_NO_RESTART_EXIT_CODE
from ft_core.straggler_scoring import StragglerAction
from ft_core.utils.validation import (
    ValidationError,
    boolean,
    convert,
    file_path,
    int_in_range,
    non_negative_seconds,
    path_or_none,
)

__all__ = ["DEFAULT_NO_RESTART_EXIT_CODE", "LauncherOptions", "add_launcher_args"]

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
#: torch's default of torchrun's ``--shutdown-timeout`` (``torch.distributed.launcher.api.LaunchConfig``).
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


@dataclasses.dataclass(frozen=True)
class LauncherOptions:
    """Validated launcher settings."""

    #: After SIGTERM/SIGINT is forwarded to the workers, SIGKILL them after this many seconds: time
    #: for a preemption save. NVRx's default; SLURM's KillWait or Kubernetes' grace period bound it anyway.
    term_timeout: float = 1800.0
    #: Workers stopped for a restart get SIGTERM, then SIGKILL after this many seconds.
    workers_stop_timeout: float = 5.0
    #: Exit code meaning "do not requeue": no progress, or shutdown requested by a rank.
    no_restart_exit_code: int = DEFAULT_NO_RESTART_EXIT_CODE
    #: Stop after this many consecutive faulty cycles without progress (0 or -1 disables).
    max_no_progress_cycles: int = FaultToleranceConfig.max_no_progress_cycles
    #: A cycle made progress if the latest checkpointed iteration grew by at least this much.
    min_progress_iterations: int = FaultToleranceConfig.min_progress_iterations
    #: Stop after the same deterministic fault this many times in a row (0 disables).
    max_identical_faults: int = FaultToleranceConfig.max_identical_faults
    #: The fault policy's bad-checkpoint and bad-node rules (0 disables each).
    suspect_checkpoint_steps: int = FaultToleranceConfig.suspect_checkpoint_steps
    suspect_node_faults: int = FaultToleranceConfig.suspect_node_faults
    #: File holding the latest checkpointed iteration (one integer), read after every cycle.
    checkpoint_iteration_file: Optional[str] = None
    #: Event log path; default ``<log dir>/`` + ``jobdir.LAUNCHER_EVENTS_FILE``.
    events_file: Optional[str] = None
    #: Debug output of the launcher and the monitor, and torch elastic's own log.
    verbose: bool = False
    #: Straggler detection (``straggler_*`` config keys; ``--ft-straggler-*`` flags); None disables it.
    straggler_report_interval: Optional[float] = FaultToleranceConfig.straggler_report_interval
    straggler_threshold: float = FaultToleranceConfig.straggler_threshold
    straggler_consecutive_reports: int = FaultToleranceConfig.straggler_consecutive_reports
    straggler_action: StragglerAction = FaultToleranceConfig.straggler_action
    straggler_min_phase_seconds: float = FaultToleranceConfig.straggler_min_phase_seconds
    #: Port of the Prometheus endpoint (``metrics_port``, ``--ft-metrics-port``); None: no endpoint.
    metrics_port: Optional[int] = FaultToleranceConfig.metrics_port
    #: Directory of the endpoint's Prometheus ``file_sd`` target file; None: beside the event log.
    metrics_targets_dir: Optional[str] = None
    #: Fork workers from a factory that has already imported ``prewarm_modules``.
    prewarm: bool = True
    #: Modules the worker factory imports before it forks workers.
    prewarm_modules: tuple[str, ...] = ("torch",)

    @classmethod
    def from_args(cls, args: argparse.Namespace, cfg: FaultToleranceConfig) -> LauncherOptions:
        """Validate the parsed flags; the no-progress settings come from ``cfg`` (YAML or ``--ft-*`` flag).

        Raises:
            ft_core.utils.validation.ValidationError: naming the flag, the value and what is allowed.
        """
        return cls(
            **_stop_timeouts(args),
            no_restart_exit_code=int_in_range("--ft-no-restart-exit-code", args.ft_no_restart_exit_code, 1, 255,
                                              coerce=True),
            max_no_progress_cycles=cfg.max_no_progress_cycles,
            min_progress_iterations=cfg.min_progress_iterations,
            max_identical_faults=cfg.max_identical_faults,
            suspect_checkpoint_steps=cfg.suspect_checkpoint_steps,
            suspect_node_faults=cfg.suspect_node_faults,
            checkpoint_iteration_file=cfg.checkpoint_iteration_file,
            events_file=file_path("--ft-events-file", args.ft_events_file),
            verbose=boolean("--verbose", args.verbose, coerce=True),
            straggler_report_interval=cfg.straggler_report_interval,
            straggler_threshold=cfg.straggler_threshold,
            straggler_consecutive_reports=cfg.straggler_consecutive_reports,
            straggler_action=cfg.straggler_action,
            straggler_min_phase_seconds=cfg.straggler_min_phase_seconds,
            metrics_port=cfg.metrics_port,
            metrics_targets_dir=path_or_none("--ft-metrics-targets-dir", args.ft_metrics_targets_dir),
            prewarm=boolean("--ft-prewarm", args.ft_prewarm, coerce=True),
            prewarm_modules=_module_names("--ft-prewarm-modules", args.ft_prewarm_modules),
        )


def _stop_timeouts(args: argparse.Namespace) -> dict[str, float]:
    """``term_timeout`` and ``workers_stop_timeout``, honouring torchrun's ``--shutdown-timeout``.

    torchrun's flag is its one grace period from SIGTERM to SIGKILL (torch applies it when
    the job ends); here there are two more (after a forwarded signal, and when stopping
    workers for a restart): it is the default of both, and a flag of ours given beside it
    wins for its own phase. Not given, it is ``$TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` when set,
    as in torch. So: ``--term-timeout`` > ``--shutdown-timeout`` > the variable > 1800 s.
    """
    defaults = LauncherOptions()
    term, stop = args.term_timeout, args.workers_stop_timeout
    shutdown = getattr(args, "shutdown_timeout", None)  # None: not given (torchrun's default is "unset")
    if shutdown is not None:
        shutdown = non_negative_seconds("--shutdown-timeout", shutdown, coerce=True)
    elif SHUTDOWN_TIMEOUT_ENV in os.environ:
        shutdown = _shutdown_timeout_env(os.environ[SHUTDOWN_TIMEOUT_ENV])
    if shutdown is not None:
        term = shutdown if term is None else term
        stop = shutdown if stop is None else stop
    return {
        "term_timeout": defaults.term_timeout if term is None else non_negative_seconds(
            "--term-timeout", term, coerce=True),
        "workers_stop_timeout": defaults.workers_stop_timeout if stop is None else non_negative_seconds(
            "--workers-stop-timeout", stop, coerce=True),
    }


def _shutdown_timeout_env(value: str) -> float:
    """``$TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, checked before torch reads it with ``int()`` (a bare ValueError)."""
    seconds = convert(SHUTDOWN_TIMEOUT_ENV, value, Annotated[int, msgspec.Meta(ge=0)],
                      "a whole number of seconds >= 0 (torch reads it with int())", coerce=True)
    return float(seconds)


def _describe_torchrun_shutdown_timeout(parser: argparse.ArgumentParser) -> None:
    """torchrun's ``--shutdown-timeout`` help, as it applies in ft_launcher (torch's text names only its 30 s)."""
    action = parser._option_string_actions.get("--shutdown-timeout")  # noqa: SLF001 - argparse has no public lookup
    if action is not None:
        action.help = (f"torchrun's grace period from SIGTERM to SIGKILL when the job ends (default: "
                       f"${SHUTDOWN_TIMEOUT_ENV}, else torch's 30), and the default of --term-timeout and "
                       "--workers-stop-timeout when they are not given")


def add_launcher_args(parser: argparse.ArgumentParser) -> None:
    """Add the launcher's fault-tolerance flags to a torchrun argument parser."""
    defaults = LauncherOptions()
    _describe_torchrun_shutdown_timeout(parser)
    group = parser.add_argument_group("ft_launcher", "Restart policy, signals and event log.")
    # Defaults None: "not given", so that torchrun's --shutdown-timeout can set both (see _stop_timeouts).
    group.add_argument("--term-timeout", "--term_timeout", default=None, metavar="SECONDS",
                       help="after SIGTERM/SIGINT is forwarded to the workers, SIGKILL them after this many "
                            "seconds: the time a rank has to save before preemption (default: --shutdown-timeout, "
                            f"else ${SHUTDOWN_TIMEOUT_ENV}, else {defaults.term_timeout:g} as in NVRx)")
    group.add_argument("--workers-stop-timeout", "--workers_stop_timeout", default=None, metavar="SECONDS",
                       help="workers stopped for a restart get SIGTERM, then SIGKILL after this many seconds "
                            f"(default: --shutdown-timeout, else ${SHUTDOWN_TIMEOUT_ENV}, else "
                            f"{defaults.workers_stop_timeout:g})")
    group.add_argument("--ft-no-restart-exit-code", "--ft_no_restart_exit_code",
                       default=defaults.no_restart_exit_code, metavar="CODE",
                       help="exit code when the job stops for lack of progress or because a rank requested "
                            f"ShutdownWorkload: do not requeue (default: {defaults.no_restart_exit_code})")
    group.add_argument("-v", "--verbose", action="store_true",
                       help="more output: --ft-log-level=DEBUG (launcher and rank monitor: every detection step, "
                            "the stacks of hung ranks) and torch elastic's own log, which is quiet by default")
    group.add_argument("--ft-events-file", "--ft_events_file", default=None, metavar="PATH",
                       help=f"JSON-lines event log (default: <log-dir>/{LAUNCHER_EVENTS_FILE}, or torchelastic's "
                            "temporary log directory when --log-dir is not given)")
    group.add_argument("--ft-metrics-targets-dir", "--ft_metrics_targets_dir", default=None, metavar="DIR",
                       help="with --ft-metrics-port: write this launcher's endpoint as a Prometheus file_sd target "
                            "file (<host>-<pid>.json, removed at exit) into DIR (default: ft_metrics_targets/ "
                            "beside the event log)")
    # NVRx's launcher fails without a config file unless told not to; ours never needs one. NeMo-Run
    # renders this flag when no fault-tolerance setting is given: accepted (hidden) and ignored.
    group.add_argument("--ignore-missing-fault-tol-cfg", action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--ft-prewarm", "--ft_prewarm", default="on" if defaults.prewarm else "off", metavar="on|off",
                       help="fork each cycle's workers from a factory process that has already imported "
                            "--ft-prewarm-modules, instead of starting new interpreters (default: on)")
    group.add_argument("--ft-no-prewarm", "--ft_no_prewarm", dest="ft_prewarm", action="store_const", const="off",
                       help="the same as --ft-prewarm=off")
    group.add_argument("--ft-prewarm-modules", "--ft_prewarm_modules", default=",".join(defaults.prewarm_modules),
                       metavar="MODULES",
                       help="comma-separated modules the worker factory imports before forking workers, e.g. "
                            f"torch,lightning,megatron.core (default: {','.join(defaults.prewarm_modules)})")


def _module_names(flag: str, value: object) -> tuple[str, ...]:
    names = tuple(name.strip() for name in str(value).split(",") if name.strip())
    for name in names:
        if not _MODULE_NAME.fullmatch(name):
            raise ValidationError(flag, value, "comma-separated module names like 'torch,lightning,megatron.core'",
                                  problem=f"invalid value {value!r} ({name!r} is not a module name)")
    return names
