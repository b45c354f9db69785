"""StrEnum: a member is its value wherever users see it (comparisons, f-strings, JSON, error messages)."""

from __future__ import annotations

import json

import pytest

from ft_core.utils.strenum import StrEnum


class Mode(StrEnum):
    AUTO = "auto"
    OFF = "off"


def test_a_member_compares_hashes_formats_and_serialises_as_its_value():
    assert Mode("auto") is Mode.AUTO and Mode.AUTO == "auto" and {"auto": 1}[Mode.AUTO] == 1
    assert (str(Mode.OFF), f"{Mode.OFF}", f"{Mode.OFF:>4}", json.dumps(Mode.OFF)) == ("off", "off", " off", '"off"')


def test_choices_lists_the_allowed_values_in_definition_order_for_error_messages():
    assert Mode.choices() == "auto, off"
    with pytest.raises(ValueError, match="'on' is not a valid Mode"):
        Mode("on")
