"""Argument checks with one error type and one message format, for every boundary of the project.

Config keys, ``ft_launcher`` flags, in-process restart options, Megatron flags
and the Lightning callback's arguments are all checked here, so a bad value
always reads the same way: what was given, where, and what is allowed::

    <name>: invalid value <value!r>; allowed: <what is allowed>

Type conversion is msgspec's (``msgspec.convert``): exact types for Python
arguments, and with ``coerce=True`` (values from the command line, YAML or the
environment) also the text forms ``"2.5"``, ``"true"``, ``"none"``...

Example::

    >>> from ft_core.utils.validation import ValidationError, positive_seconds
    >>> positive_seconds("--term-timeout", " 2.5", coerce=True)
    2.5
    >>> try:
    ...     positive_seconds("Wrapper.soft_timeout", -1)
    ... except ValidationError as exc:
    ...     print(exc)
    Wrapper.soft_timeout: invalid value -1; allowed: a positive number of seconds
"""

from __future__ import annotations

import enum
import os
import signal
import sys
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Optional, TypeVar, overload

import msgspec

__all__ = [
    "NONE_WORDS",
    "ValidationError",
    "ValidationTypeError",
    "boolean",
    "callable_or_none",
    "convert",
    "enum_member",
    "file_path",
    "int_in_range",
    "is_none_word",
    "non_negative_int",
    "non_negative_seconds",
    "one_of",
    "path_or_none",
    "positive_seconds",
    "signal_or_none",
]

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)

#: Text that means "no value" (e.g. "no timeout") where ``None`` is allowed and text is accepted.
#: Not the empty string: ``--ft-rank-heartbeat-timeout=$UNSET`` must not silently disable a timeout.
NONE_WORDS = frozenset({"none", "null", "off"})
_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
# Finite only: inf and nan are not a number of seconds (msgspec's le/ge reject both).
_POSITIVE = Annotated[float, msgspec.Meta(gt=0, le=sys.float_info.max)]
_NON_NEGATIVE = Annotated[float, msgspec.Meta(ge=0, le=sys.float_info.max)]


class ValidationError(ValueError):
    """A value that is not allowed: ``name`` (argument, flag or key), ``value`` and ``allowed`` say which,
    what and what instead; ``problem`` replaces "invalid value ..." when the value alone does not say it."""

    def __init__(self, name: str, value: Any, allowed: str, problem: Optional[str] = None) -> None:
        self.name = name
        self.value = value
        self.allowed = allowed
        self.problem = problem
        super().__init__(f"{name}: {problem or f'invalid value {value!r}'}; allowed: {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle their ``args`` (the message); ours are rebuilt from their parts.
        return type(self), (self.name, self.value, self.allowed, self.problem)


class ValidationTypeError(ValidationError, TypeError):
    """A value of the wrong kind where Python code expects ``TypeError`` (e.g. a hook that is not callable)."""


def is_none_word(value: Any) -> bool:
    """``None``, or text meaning none (``"none"``, ``"null"``, ``"off"``; any case). Empty text is not none."""
    return value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)


def convert(name: str, value: Any, type_: Any, allowed: str, *, coerce: bool = False) -> Any:
    """``value`` as ``type_`` (any type ``msgspec.convert`` knows, constraints included).

    ``coerce`` accepts numbers and booleans written as text (msgspec's
    ``strict=False``; surrounding blanks are ignored). The error shows the
    value as given.
    """
    given = value
    if coerce and isinstance(value, str):
        value = value.strip()
    try:
        return msgspec.convert(value, type_, strict=not coerce)
    except msgspec.ValidationError:
        raise ValidationError(name, given, allowed) from None


@overload
def positive_seconds(name: str, value: Any, *, allow_none: Literal[False] = ..., coerce: bool = ...) -> float: ...
@overload
def positive_seconds(name: str, value: Any, *, allow_none: bool, coerce: bool = ...) -> Optional[float]: ...
def positive_seconds(name: str, value: Any, *, allow_none: bool = False, coerce: bool = False) -> Optional[float]:
    """A finite number of seconds > 0; with ``allow_none``, also ``None`` (and, with ``coerce``, "none")."""
    return _seconds(name, value, _POSITIVE, "a positive number of seconds", allow_none, coerce)


@overload
def non_negative_seconds(name: str, value: Any, *, allow_none: Literal[False] = ..., coerce: bool = ...) -> float: ...
@overload
def non_negative_seconds(name: str, value: Any, *, allow_none: bool, coerce: bool = ...) -> Optional[float]: ...
def non_negative_seconds(name: str, value: Any, *, allow_none: bool = False, coerce: bool = False) -> Optional[float]:
    """A finite number of seconds >= 0; ``allow_none`` and ``coerce`` as in :func:`positive_seconds`."""
    return _seconds(name, value, _NON_NEGATIVE, "a number of seconds >= 0", allow_none, coerce)


def _seconds(name: str, value: Any, type_: Any, allowed: str, allow_none: bool, coerce: bool) -> Optional[float]:
    if allow_none:
        allowed += " or none/null" if coerce else " or None"
        if value is None or (coerce and is_none_word(value)):
            return None
    return float(convert(name, value, type_, allowed, coerce=coerce))


def int_in_range(name: str, value: Any, minimum: int, maximum: Optional[int] = None, *, coerce: bool = False) -> int:
    """An integer in ``minimum..maximum`` (no upper bound when ``maximum`` is None); never a bool."""
    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    return int(convert(name, value, Annotated[int, msgspec.Meta(ge=minimum, le=maximum)], allowed, coerce=coerce))


def non_negative_int(name: str, value: Any, *, coerce: bool = False) -> int:
    """An integer >= 0."""
    return int_in_range(name, value, 0, coerce=coerce)


def boolean(name: str, value: Any, *, coerce: bool = False) -> bool:
    """``True`` or ``False``; with ``coerce`` also 1/0 and true/false, yes/no, on/off (any case)."""
    if coerce and isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    return bool(convert(name, value, bool, "true or false" if coerce else "True or False", coerce=coerce))


def one_of(name: str, value: Any, choices: Iterable[T]) -> T:
    """``value`` if it is one of ``choices`` (compared by equality and type: ``1`` is not ``True``)."""
    options = tuple(choices)
    for option in options:
        if type(option) is type(value) and option == value:
            return option
    raise ValidationError(name, value, "one of " + ", ".join(str(option) for option in options))


def enum_member(name: str, value: Any, enum_type: type[E], *, coerce: bool = False) -> E:
    """A member of ``enum_type``, given as the member or its value; with ``coerce`` also by name, in any case."""
    if coerce and isinstance(value, str):
        wanted = value.strip().upper()
        for member_name, member in enum_type.__members__.items():
            if member_name.upper() == wanted:
                return member
    # Users write a str enum's values (``mode="sections"``); other enums are named (``SIGTERM``).
    allowed = "one of " + ", ".join(member.value if isinstance(member.value, str) else member.name
                                    for member in enum_type)
    by_value: E = convert(name, value, enum_type, allowed, coerce=coerce)
    return by_value


@overload
def signal_or_none(name: str, value: Any, *, allow_none: Literal[False] = ...) -> signal.Signals: ...
@overload
def signal_or_none(name: str, value: Any, *, allow_none: bool) -> Optional[signal.Signals]: ...
def signal_or_none(name: str, value: Any, *, allow_none: bool = False) -> Optional[signal.Signals]:
    """A signal from ``signal.SIGTERM``, ``15``, ``"15"``, ``"SIGTERM"`` or ``"term"``; "none" with ``allow_none``."""
    if allow_none and is_none_word(value):
        return None
    allowed = "a signal name like 'SIGKILL' or 'SIGTERM', or a signal number" + (", or none" if allow_none else "")
    if isinstance(value, str) and not value.strip().isdigit():
        text = value.strip().upper()
        by_name = signal.Signals.__members__.get(text if text.startswith("SIG") else "SIG" + text)
        if by_name is None:
            raise ValidationError(name, value, allowed)
        return by_name
    by_number: signal.Signals = convert(name, value, signal.Signals, allowed, coerce=True)
    return by_number


def callable_or_none(name: str, value: Any, *, allow_none: bool = True, allowed: Optional[str] = None) -> Any:
    """``value`` if it is callable (or ``None`` with ``allow_none``); else :class:`ValidationTypeError`."""
    if (value is None and allow_none) or callable(value):
        return value
    raise ValidationTypeError(name, value, allowed or ("None or a callable" if allow_none else "a callable"))


def path_or_none(name: str, value: Any) -> Optional[str]:
    """A ``str``/``os.PathLike`` path as ``str``, or ``None``."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise ValidationError(name, value, "a path or None")


def file_path(name: str, value: Any) -> Optional[str]:
    """A path for a file this program reads or writes (it need not exist yet): not a directory.

    ``None`` and ``""`` mean "not given" and return ``None``.
    """
    path = path_or_none(name, value)
    if not path:
        return None
    if os.path.isdir(path):
        raise ValidationError(name, value, "a file path", problem=f"{path!r} is a directory")
    return path
