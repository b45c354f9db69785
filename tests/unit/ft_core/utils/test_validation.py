"""ft_core.utils.validation: the one error type and message format, and the forms each check accepts."""

from __future__ import annotations

import enum
import math
import pickle
import signal

import pytest

from ft_core.utils.validation import (
    ValidationError,
    ValidationTypeError,
    boolean,
    callable_or_none,
    enum_member,
    file_path,
    int_in_range,
    non_negative_int,
    non_negative_seconds,
    one_of,
    path_or_none,
    positive_seconds,
    signal_or_none,
)


def test_message_names_the_argument_the_value_and_what_is_allowed():
    error = ValidationError("--term-timeout", "soon", "a number of seconds >= 0")
    assert str(error) == "--term-timeout: invalid value 'soon'; allowed: a number of seconds >= 0"
    assert isinstance(error, ValueError)
    assert (error.name, error.value, error.allowed) == ("--term-timeout", "soon", "a number of seconds >= 0")
    explained = ValidationError("x", 1, "y", problem="x is taken")
    assert str(explained) == "x: x is taken; allowed: y"
    copy = pickle.loads(pickle.dumps(explained))  # e.g. raised in a worker, reported by its parent
    assert type(copy) is ValidationError and str(copy) == str(explained)
    assert issubclass(ValidationTypeError, TypeError) and issubclass(ValidationTypeError, ValidationError)


@pytest.mark.parametrize("value", [-1, 0, math.inf, math.nan, True, "2", None, [1]])
def test_positive_seconds_rejects(value):
    with pytest.raises(ValidationError, match=r"^t: invalid value .*; allowed: a positive number of seconds$"):
        positive_seconds("t", value)


def test_seconds_accepted_forms():
    assert positive_seconds("t", 3) == 3.0 and isinstance(positive_seconds("t", 3), float)
    assert positive_seconds("t", " 2.5 ", coerce=True) == 2.5
    assert positive_seconds("t", None, allow_none=True) is None
    for word in ("none", "NULL", "off"):
        assert positive_seconds("t", word, allow_none=True, coerce=True) is None
    # Empty text is not "none": an unset shell variable (--flag=$UNSET) must not disable a timeout.
    for empty in ("", "  "):
        with pytest.raises(ValidationError, match=r"^t: invalid value '\s*'; allowed: a positive number of seconds"):
            positive_seconds("t", empty, allow_none=True, coerce=True)
    with pytest.raises(ValidationError, match="allowed: a positive number of seconds or None$"):
        positive_seconds("t", "none", allow_none=True)  # text only where text is expected
    with pytest.raises(ValidationError, match="allowed: a positive number of seconds or none/null$"):
        positive_seconds("t", "later", allow_none=True, coerce=True)
    assert non_negative_seconds("t", 0) == 0.0
    with pytest.raises(ValidationError, match="allowed: a number of seconds >= 0"):
        non_negative_seconds("t", "-0.5", coerce=True)


def test_integers():
    assert int_in_range("n", 5, 1, 10) == 5
    assert int_in_range("n", "7", 1, coerce=True) == 7
    assert non_negative_int("n", 0) == 0
    for value, coerce in ((0, False), (11, False), (2.0, False), ("3", False), (True, False), (1.5, True),
                          ("x", True)):
        with pytest.raises(ValidationError, match=r"^n: invalid value .*; allowed: an integer from 1 to 10$"):
            int_in_range("n", value, 1, 10, coerce=coerce)
    with pytest.raises(ValidationError, match="allowed: an integer >= 0$"):
        non_negative_int("n", -1)


def test_booleans():
    assert boolean("b", False) is False
    for word, expected in (("yes", True), ("On", True), ("1", True), ("false", False), ("NO", False), ("off", False)):
        assert boolean("b", word, coerce=True) is expected
    assert boolean("b", 1, coerce=True) is True
    with pytest.raises(ValidationError, match="^b: invalid value 1; allowed: True or False$"):
        boolean("b", 1)
    with pytest.raises(ValidationError, match="^b: invalid value 'maybe'; allowed: true or false$"):
        boolean("b", "maybe", coerce=True)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_choices_and_enums():
    assert one_of("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValidationError, match="^mode: invalid value 'c'; allowed: one of a, b$"):
        one_of("mode", "c", ("a", "b"))
    with pytest.raises(ValidationError, match="allowed: one of 0, 1"):
        one_of("flag", False, (0, 1))  # equal but not the same kind of value
    assert enum_member("color", "red", Color) is Color.RED
    assert enum_member("color", Color.BLUE, Color) is Color.BLUE
    assert enum_member("color", " blue ", Color, coerce=True) is Color.BLUE  # by name, any case
    with pytest.raises(ValidationError, match="^color: invalid value 'RED'; allowed: one of red, blue$"):
        enum_member("color", "RED", Color)


@pytest.mark.parametrize(("value", "expected"), [
    (signal.SIGTERM, signal.SIGTERM), (15, signal.SIGTERM), ("15", signal.SIGTERM), ("SIGTERM", signal.SIGTERM),
    ("term", signal.SIGTERM), (" sigusr1 ", signal.SIGUSR1),
])
def test_signals(value, expected):
    assert signal_or_none("s", value) is expected


def test_bad_signals_and_none():
    for value in ("SIGNOPE", 999, True, 2.5, None):
        with pytest.raises(ValidationError, match="allowed: a signal name like 'SIGKILL' or 'SIGTERM', or a signal"):
            signal_or_none("s", value)
    assert signal_or_none("s", "none", allow_none=True) is None
    assert signal_or_none("s", None, allow_none=True) is None


def test_callables_and_paths(tmp_path):
    assert callable_or_none("hook", None) is None
    assert callable_or_none("hook", len) is len
    with pytest.raises(ValidationTypeError, match="^hook: invalid value 3; allowed: None or a callable$"):
        callable_or_none("hook", 3)
    with pytest.raises(TypeError, match="allowed: a callable$"):
        callable_or_none("hook", None, allow_none=False)
    assert path_or_none("p", tmp_path) == str(tmp_path) and path_or_none("p", None) is None
    with pytest.raises(ValidationError, match="^p: invalid value 3; allowed: a path or None$"):
        path_or_none("p", 3)
    assert file_path("f", str(tmp_path / "new.json")) == str(tmp_path / "new.json")  # need not exist yet
    assert file_path("f", "") is None
    with pytest.raises(ValidationError, match=r"^f: '.*' is a directory; allowed: a file path$"):
        file_path("f", str(tmp_path))
