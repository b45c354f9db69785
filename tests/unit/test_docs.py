"""The README documents every configuration key and every launcher flag of ours."""

from __future__ import annotations

import os
import re

from helpers import REPO_ROOT

from ft_core.config import FaultToleranceConfig

README = open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8").read()


def test_every_config_key_is_in_the_reference_table():
    table = README.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M))
    assert documented == set(FaultToleranceConfig.field_names())


def test_launcher_flags_and_exit_codes_are_documented():
    for flag in ("--ft-cfg-path", "--term-timeout", "--workers-stop-timeout", "--ft-no-restart-exit-code",
                 "--ft-max-no-progress-cycles", "--ft-checkpoint-iteration-file", "--ft-events-file",
                 "--ft-prewarm", "--ft-no-prewarm", "--ft-prewarm-modules"):
        assert flag in README, flag
    exit_codes = README.split("### Exit codes", 1)[1].split("\n### ", 1)[0]
    for code in ("| 0 |", "| 1 |", "| 93 |"):
        assert code in exit_codes

