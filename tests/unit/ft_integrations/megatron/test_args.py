"""``add_ft_args``: Megatron flags, their defaults, and coexistence with ``--ft-<field>`` flags."""

from __future__ import annotations

import argparse

import pytest

from ft_core.config import FaultToleranceConfig
from ft_integrations.megatron import add_ft_args
from ft_integrations.megatron.args import DEFAULT_CALC_TIMEOUTS_AFTER_ITERS, DEFAULT_NUM_WARMUP_ITERS


def test_defaults_and_returns_the_parser():
    parser = argparse.ArgumentParser()
    assert add_ft_args(parser) is parser
    args = parser.parse_args([])
    assert args.enable_ft_package is False
    assert args.calc_ft_timeouts is False
    assert args.ft_num_warmup_iters == DEFAULT_NUM_WARMUP_ITERS == 5
    assert args.ft_calc_timeouts_after_iters == DEFAULT_CALC_TIMEOUTS_AFTER_ITERS
    assert args.ft_state_file is None


@pytest.mark.parametrize("flag", ["--enable-ft", "--enable-ft-package"])
def test_enable_flag_and_its_alias(flag):
    args = add_ft_args(argparse.ArgumentParser()).parse_args(
        [flag, "--calc-ft-timeouts", "--ft-num-warmup-iters=0", "--ft-calc-timeouts-after-iters", "3",
         "--ft-state-file", "/tmp/x.json"])
    assert args.enable_ft_package and args.calc_ft_timeouts
    assert (args.ft_num_warmup_iters, args.ft_calc_timeouts_after_iters, args.ft_state_file) == (0, 3, "/tmp/x.json")


@pytest.mark.parametrize(("argv", "message"), [
    (["--ft-num-warmup-iters=-1"], "argument --ft-num-warmup-iters: invalid value '-1'; allowed: an integer >= 0"),
    (["--ft-calc-timeouts-after-iters=0"],
     "argument --ft-calc-timeouts-after-iters: invalid value '0'; allowed: an integer >= 1"),
    (["--ft-num-warmup-iters=two"], "argument --ft-num-warmup-iters: invalid value 'two'; allowed: an integer >= 0"),
])
def test_bad_numbers_are_rejected_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        add_ft_args(argparse.ArgumentParser()).parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("config_first", [True, False])
def test_coexists_with_fault_tolerance_config_flags(config_first):
    parser = argparse.ArgumentParser()
    if config_first:
        FaultToleranceConfig.add_argparse_args(parser)
    add_ft_args(parser)
    if not config_first:
        FaultToleranceConfig.add_argparse_args(parser)
    args = parser.parse_args(["--enable-ft", "--ft-num-warmup-iters=2", "--ft-num-warmup-iterations=7",
                              "--ft-rank-section-timeouts=step:30"])
    assert args.ft_num_warmup_iters == 2
    assert FaultToleranceConfig.from_args(args).num_warmup_iterations == 7
    assert FaultToleranceConfig.from_args(args).rank_section_timeouts == {"step": 30.0}


def test_megatron_lm_flags_already_present_are_kept_and_calling_twice_is_harmless():
    parser = argparse.ArgumentParser()
    # Megatron-LM's own parser defines these two (same dests).
    parser.add_argument("--enable-ft-package", action="store_true")
    parser.add_argument("--calc-ft-timeouts", action="store_true")
    add_ft_args(add_ft_args(parser))
    assert parser.parse_args(["--enable-ft"]).enable_ft_package is True
    assert parser.parse_args(["--enable-ft-package", "--calc-ft-timeouts"]).calc_ft_timeouts is True
