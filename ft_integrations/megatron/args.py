"""Command-line flags of the Megatron integration (``add_ft_args``, a Megatron ``extra_args_provider``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ft_core.utils.validation import ValidationError, int_in_range

__all__ = ["DEFAULT_CALC_TIMEOUTS_AFTER_ITERS", "DEFAULT_NUM_WARMUP_ITERS", "add_ft_args"]

#: Training steps at the start of each run that stay inside ``setup`` (not timed as ``step``).
DEFAULT_NUM_WARMUP_ITERS = 5
#: Timed steps (past warm-up) before the first timeout calculation.
DEFAULT_CALC_TIMEOUTS_AFTER_ITERS = 16


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return int_in_range("", text, minimum, coerce=True)
        except ValidationError as exc:
            # argparse shows only an ArgumentTypeError's message, after "argument <flag>: ".
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; allowed: {exc.allowed}") from None

    parse.__name__ = f"int>={minimum}"
    return parse


def _add(group: argparse._ArgumentGroup, parser: argparse.ArgumentParser, flags: list[str],
         **kwargs: Any) -> None:
    # Megatron-LM itself defines --enable-ft-package and --calc-ft-timeouts (same dests):
    # add only the spellings the parser lacks, so both can coexist and this stays idempotent.
    existing = parser._option_string_actions
    missing = [flag for flag in flags if flag not in existing]
    if missing:
        group.add_argument(*missing, **kwargs)


def add_ft_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the fault tolerance flags to ``parser`` and return it.

    Usable as ``megatron.training.initialize_megatron(extra_args_provider=add_ft_args)``.
    The flags do not collide with ``FaultToleranceConfig.add_argparse_args`` (``--ft-<field>``):
    the monitor's timeouts come from ``ft_launcher``, these flags steer the training-loop hooks.
    """
    group = parser.add_argument_group("fault tolerance", "ft_integrations.megatron hooks.")
    _add(group, parser, ["--enable-ft", "--enable-ft-package"], dest="enable_ft_package", action="store_true",
         help="Report to the node's rank monitor (ft_launcher): sections setup/step/eval/checkpointing.")
    _add(group, parser, ["--calc-ft-timeouts"], dest="calc_ft_timeouts", action="store_true",
         help="Learn section timeouts from observed times (after --ft-calc-timeouts-after-iters timed "
              "steps, after the first checkpoint save and at shutdown) and save them with checkpoints.")
    _add(group, parser, ["--ft-num-warmup-iters"], dest="ft_num_warmup_iters", metavar="N",
         type=_int_at_least(0), default=DEFAULT_NUM_WARMUP_ITERS,
         help="The first N training steps of each run stay in the 'setup' section: neither timed nor "
              f"learned as 'step' (default: {DEFAULT_NUM_WARMUP_ITERS}).")
    _add(group, parser, ["--ft-calc-timeouts-after-iters"], dest="ft_calc_timeouts_after_iters", metavar="N",
         type=_int_at_least(1), default=DEFAULT_CALC_TIMEOUTS_AFTER_ITERS,
         help="Timed steps past warm-up before the first timeout calculation "
              f"(default: {DEFAULT_CALC_TIMEOUTS_AFTER_ITERS}).")
    _add(group, parser, ["--ft-state-file"], dest="ft_state_file", metavar="PATH", default=None,
         help="JSON file with the learned timeouts, read at setup and rewritten (atomically) after each "
              "calculation (default: <--save>/ft_state.json when --save is given).")
    return parser
