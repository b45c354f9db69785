"""``ft_launcher``: torchrun's command line plus fault tolerance.

Every ``torchrun`` argument works the same; see ``ft_launcher --help`` and
the documentation page ``docs/launcher.md`` for the additional flags and the exit codes.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
import uuid
from typing import Optional

from torch.distributed.run import config_from_args, get_args_parser, parse_min_max_nnodes

from ft_core.config import FaultToleranceConfig, LogLevel
from ft_core.config_loading import load_args
from ft_core.launcher.launch import launch
from ft_core.launcher.options import LauncherOptions, add_launcher_args
from ft_core.launcher.outcome import exit_codes_help
from ft_core.launcher.rendezvous.conf import check_rdzv_conf
from ft_core.launcher.rendezvous.slurm import apply_slurm_defaults, derive_nnodes
from ft_core.launcher.startup.head_start import HeadStart
from ft_core.utils.validation import ValidationError
from ft_core.version import version_line

__all__ = ["build_parser", "main"]

log = logging.getLogger("ft_core.launcher")

#: torch loggers that repeat what the launcher reports (quiet unless -v / --ft-log-level=DEBUG).
_TORCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")

_SUBCOMMANDS = """\
subcommand:
  ft_launcher report LOG_DIR|EVENT_LOG ... [--json] [--plot FILE.png]
       the goodput report of a job: faults, culprits, time lost, from the event logs of every
       node and requeue (ft_launcher report --help)
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` lists each flag in every spelling torchrun's own help shows, less the aliases.

    Every flag also parses in torchrun's underscore spelling and, for config keys, in
    NVRx's (``--ft-param-<key>``, ``--ft-<key_with_underscores>``); listing them all
    made every config flag six names long. Short and long forms (``-m, --module``) stay.
    """

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [name for name in action.option_strings if not _is_alias(name)]
        if action.option_strings and shown != action.option_strings:
            action = copy.copy(action)
            action.option_strings = shown or action.option_strings[:1]
        return super()._format_action_invocation(action)


def _is_alias(option: str) -> bool:
    """An underscore spelling (``--nproc_per_node``) or NVRx's ``--ft-param-<key>``: parsed, not listed."""
    return "_" in option or option.startswith("--ft-param-")


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser with the ``--ft-*`` config flags and the launcher's own flags."""
    parser = get_args_parser()
    parser.prog = "ft_launcher"
    parser.description = ("torchrun with fault tolerance: hang and crash detection, in-job restart of all "
                          "workers of the job, workload control, progress tracking and an event log.")
    parser.epilog = _SUBCOMMANDS + "\n" + exit_codes_help()
    parser.formatter_class = _HelpFormatter
    if "PET_MONITOR_INTERVAL" not in os.environ:
        parser.set_defaults(monitor_interval=0.1)  # older torch defaults to 5 s: far too slow to restart
    if "PET_NNODES" not in os.environ:
        parser.set_defaults(nnodes=None)  # not given: derive_nnodes (the srun step's nodes, else torchrun's 1:1)
    parser.add_argument("--version", action="version", version=version_line(parser.prog),
                        help="print ft-suite-pytorch's, Python's and torch's versions and exit")
    FaultToleranceConfig.add_argparse_args(parser)
    add_launcher_args(parser)
    return parser


def _normalize_rendezvous(args: argparse.Namespace) -> None:
    """Apply torchrun's rendezvous defaults (``torch.distributed.run.run`` does this inline before launching)."""
    _, max_nodes = parse_min_max_nnodes(args.nnodes)
    single_node_default = (args.rdzv_backend == "static" and not args.rdzv_endpoint
                           and args.master_port is None and max_nodes == 1)
    if args.standalone or single_node_default:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


def _quiet_torch_elastic() -> None:
    """Torch elastic logs every worker failure and stop on its own; the launcher reports each once.

    Its loggers are named after their modules; some get an explicit level when created.
    """
    names = [name for name in logging.root.manager.loggerDict if name.startswith(_TORCH_LOGGERS)]
    for name in {*_TORCH_LOGGERS, *names}:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: Optional[list[str]] = None, *, head_start: Optional[HeadStart] = None) -> int:
    """Entry point of the ``ft_launcher`` console script; returns the exit code.

    ``ft_launcher report LOG_DIR ...`` prints the goodput report of a job (:mod:`ft_core.launcher.observability.report`).
    ``head_start``: the processes started before the imports (see :mod:`ft_core.launcher.startup.head_start`).
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        from ft_core.launcher.observability.report import main as report_main

        return report_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    # Before the config is read: it may warn (e.g. about NVRx keys that are not implemented).
    logging.basicConfig(format="[%(asctime)s %(name)s] %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        loaded = load_args(args)
        options = LauncherOptions.from_args(args, loaded.cfg)
        derived = derive_nnodes(args)
        try:
            _normalize_rendezvous(args)
        except (ValueError, RuntimeError):
            raise ValidationError("--nnodes", args.nnodes, "a number of nodes N or a range MIN:MAX") from None
        derived += apply_slurm_defaults(args)
        config, entrypoint, cmd_args = config_from_args(args)
        check_rdzv_conf(config.rdzv_configs)  # the launcher's own keys: a usage error, not a failed job
    except ValidationError as exc:
        # One line, as for any argparse error but without the (long) usage: the message says it all.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except (ValueError, RuntimeError, AssertionError) as exc:
        parser.error(f"invalid arguments: {exc}")
    if options.verbose:
        loaded = loaded.replace(log_level=LogLevel.DEBUG)
    cfg = loaded.cfg
    logging.basicConfig(format="[%(asctime)s %(name)s] %(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("ft_core").setLevel(cfg.log_level)
    if cfg.log_level != LogLevel.DEBUG:
        _quiet_torch_elastic()
    if derived:
        log.info("under SLURM job %s: %s", os.environ.get("SLURM_JOB_ID"), " ".join(derived))
    return launch(config, entrypoint, cmd_args, loaded, options, head_start=head_start)


if __name__ == "__main__":
    sys.exit(main())
