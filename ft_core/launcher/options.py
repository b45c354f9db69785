"""ft_launcher's own flags (beyond torchrun's and the ``--ft-<field>`` config flags)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Optional

from ft_core.config import ConfigError

__all__ = ["DEFAULT_NO_RESTART_EXIT_CODE", "LauncherOptions", "add_launcher_args"]

DEFAULT_NO_RESTART_EXIT_CODE = 93
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_ON_OFF = {"on": True, "off": False}


@dataclasses.dataclass(frozen=True)
class LauncherOptions:
    """Validated launcher settings."""

    #: After SIGTERM/SIGINT is forwarded to the workers, SIGKILL them after this many seconds.
    term_timeout: float = 15.0
    #: Workers stopped for a restart get SIGTERM, then SIGKILL after this many seconds.
    workers_stop_timeout: float = 5.0
    #: Exit code meaning "do not requeue": no progress, or shutdown requested by a rank.
    no_restart_exit_code: int = DEFAULT_NO_RESTART_EXIT_CODE
    #: Stop after this many consecutive faulty cycles without a newer checkpoint (0 disables).
    max_no_progress_cycles: int = 3
    #: File holding the latest checkpointed iteration (one integer), read after every cycle.
    checkpoint_iteration_file: Optional[str] = None
    #: Event log path; default ``<log dir>/ft_events.jsonl``.
    events_file: Optional[str] = None
    #: Fork workers from a factory that has already imported ``prewarm_modules``.
    prewarm: bool = True
    #: Modules the worker factory imports before it forks workers.
    prewarm_modules: tuple[str, ...] = ("torch",)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LauncherOptions:
        """Validate the parsed flags; errors name the flag, the value and what is allowed."""
        return cls(
            term_timeout=_seconds("--term-timeout", args.term_timeout),
            workers_stop_timeout=_seconds("--workers-stop-timeout", args.workers_stop_timeout),
            no_restart_exit_code=_int_in("--ft-no-restart-exit-code", args.ft_no_restart_exit_code, 1, 255),
            max_no_progress_cycles=_int_in("--ft-max-no-progress-cycles", args.ft_max_no_progress_cycles, 0, None),
            checkpoint_iteration_file=args.ft_checkpoint_iteration_file or None,
            events_file=args.ft_events_file or None,
            prewarm=_on_off("--ft-prewarm", args.ft_prewarm),
            prewarm_modules=_module_names("--ft-prewarm-modules", args.ft_prewarm_modules),
        )


def add_launcher_args(parser: argparse.ArgumentParser) -> None:
    """Add the launcher's fault-tolerance flags to a torchrun argument parser."""
    defaults = LauncherOptions()
    group = parser.add_argument_group("ft_launcher", "Restart policy, signals and event log.")
    group.add_argument("--term-timeout", "--term_timeout", default=defaults.term_timeout, metavar="SECONDS",
                       help="after SIGTERM/SIGINT is forwarded to the workers, SIGKILL them after this many "
                            f"seconds (default: {defaults.term_timeout})")
    group.add_argument("--workers-stop-timeout", "--workers_stop_timeout", default=defaults.workers_stop_timeout,
                       metavar="SECONDS",
                       help="workers stopped for a restart get SIGTERM, then SIGKILL after this many seconds "
                            f"(default: {defaults.workers_stop_timeout})")
    group.add_argument("--ft-no-restart-exit-code", "--ft_no_restart_exit_code",
                       default=defaults.no_restart_exit_code, metavar="CODE",
                       help="exit code when the job stops for lack of progress or because a rank requested "
                            f"ShutdownWorkload: do not requeue (default: {defaults.no_restart_exit_code})")
    group.add_argument("--ft-max-no-progress-cycles", "--ft_max_no_progress_cycles",
                       default=defaults.max_no_progress_cycles, metavar="N",
                       help="stop after N consecutive faulty cycles without a newer checkpointed iteration; "
                            f"0 disables (default: {defaults.max_no_progress_cycles})")
    group.add_argument("--ft-checkpoint-iteration-file", "--ft_checkpoint_iteration_file", default=None,
                       metavar="PATH",
                       help="file holding the latest checkpointed iteration (one integer); progress signal in "
                            "addition to RankMonitorClient.report_checkpoint()")
    group.add_argument("--ft-events-file", "--ft_events_file", default=None, metavar="PATH",
                       help="JSON-lines event log (default: <log-dir>/ft_events.jsonl, or torchelastic's "
                            "temporary log directory when --log-dir is not given)")
    group.add_argument("--ft-prewarm", "--ft_prewarm", default="on" if defaults.prewarm else "off", metavar="on|off",
                       help="fork each cycle's workers from a factory process that has already imported "
                            "--ft-prewarm-modules, instead of starting new interpreters (default: on)")
    group.add_argument("--ft-no-prewarm", "--ft_no_prewarm", dest="ft_prewarm", action="store_const", const="off",
                       help="the same as --ft-prewarm=off")
    group.add_argument("--ft-prewarm-modules", "--ft_prewarm_modules", default=",".join(defaults.prewarm_modules),
                       metavar="MODULES",
                       help="comma-separated modules the worker factory imports before forking workers, e.g. "
                            f"torch,lightning,megatron.core (default: {','.join(defaults.prewarm_modules)})")


def _seconds(flag: str, value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{flag}: invalid value {value!r}; allowed: a number of seconds >= 0")
    return seconds


def _int_in(flag: str, value: object, low: int, high: Optional[int]) -> int:
    allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"{flag}: invalid value {value!r}; allowed: {allowed}") from None
    if number < low or (high is not None and number > high):
        raise ConfigError(f"{flag}: invalid value {value!r}; allowed: {allowed}")
    return number


def _on_off(flag: str, value: object) -> bool:
    word = str(value).strip().lower()
    if word not in _ON_OFF:
        raise ConfigError(f"{flag}: invalid value {value!r}; allowed: on or off")
    return _ON_OFF[word]


def _module_names(flag: str, value: object) -> tuple[str, ...]:
    names = tuple(name.strip() for name in str(value).split(",") if name.strip())
    for name in names:
        if not _MODULE_NAME.fullmatch(name):
            raise ConfigError(f"{flag}: invalid value {value!r}; allowed: comma-separated module names like "
                              f"'torch,lightning,megatron.core' ({name!r} is not one)")
    return names
