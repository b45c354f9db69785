"""``StrEnum``: the base of the integrations' closed sets of user-facing strings (modes, policies, names).

Python 3.10 has no ``enum.StrEnum``; Lightning's ``lightning_utilities`` has one, but the
Megatron integration must not depend on Lightning.
"""

from __future__ import annotations

import enum

__all__ = ["StrEnum"]


class StrEnum(str, enum.Enum):
    """A member is its value: it compares, hashes, prints and serialises as that string.

    >>> class Color(StrEnum):
    ...     RED = "red"
    >>> Color("red") is Color.RED, Color.RED == "red", f"{Color.RED}", Color.choices()
    (True, True, 'red', 'red')
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        # Python 3.11 formats a mixed-in enum as "Class.MEMBER"; users wrote the value.
        return format(str(self.value), format_spec)

    @classmethod
    def choices(cls) -> str:
        """The allowed values, in definition order, for error messages: ``"a, b, c"``."""
        return ", ".join(member.value for member in cls)
