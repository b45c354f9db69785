"""The launcher's own ``--rdzv-conf`` keys (:mod:`ft_core.launcher.rendezvous.conf`): defaults, and one error per bad value.

(The command line's exit 2 for them: ``tests/integration/ft_core/launcher/test_cli.py``.)
"""

from __future__ import annotations

import pytest

from ft_core.launcher.rendezvous.conf import (
    LOST_AFTER,
    MIN_LOST_AFTER,
    beat_interval,
    check_rdzv_conf,
    lost_after,
    switched_on,
)
from ft_core.utils.validation import ValidationError


def test_the_switches_default_on_read_text_and_name_the_key_of_a_bad_value():
    assert switched_on({}, "wake_on_change") and switched_on({"members_first": "true"}, "members_first")
    assert not switched_on({"wake_on_change": "0"}, "wake_on_change")
    with pytest.raises(ValidationError, match=r"--rdzv-conf members_first: invalid value 'maybe'; allowed: true or"):
        check_rdzv_conf({"members_first": "maybe"})
    check_rdzv_conf({"wake_on_change": "false", "members_first": "1", "lost_after": "10", "keep_alive_interval": "x"})


def test_the_conf_key_sets_the_span_turns_the_rule_off_and_a_bad_value_is_one_error_naming_it():
    assert lost_after({}) == LOST_AFTER == 3.0
    assert lost_after({"lost_after": "5"}) == 5.0
    assert lost_after({"lost_after": "0"}) == 0.0
    assert beat_interval(LOST_AFTER) == 0.5 and beat_interval(12) == 2.0  # six beats per span
    allowed = f"allowed: 0 \\(off\\) or a number of seconds >= {MIN_LOST_AFTER:g}"
    for bad in ("1", "-3", "soon", "nan"):
        with pytest.raises(ValidationError, match=f"--rdzv-conf lost_after: invalid value '{bad}'; {allowed}"):
            lost_after({"lost_after": bad})
        with pytest.raises(ValidationError, match="lost_after"):  # what the command line runs before the job
            check_rdzv_conf({"wake_on_change": "1", "lost_after": bad})
