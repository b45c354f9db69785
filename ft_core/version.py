"""The installed ft-suite version (distribution ``ft-suite-pytorch``) (``ft_core.__version__``), read from the package metadata.

One home for the version: ``pyproject.toml``. The installed distribution's
metadata carries it; a source tree used without installing has none and
reports :data:`UNKNOWN_VERSION`.

Example::

    >>> from ft_core.version import version_line
    >>> version_line("ft_launcher").startswith("ft_launcher (ft-suite-pytorch) ")
    True
"""

from __future__ import annotations

import functools
import sys

__all__ = ["DISTRIBUTION", "UNKNOWN_VERSION", "python_version", "torch_version", "version",
           "version_line"]

#: The distribution name (``pip install ft-suite-pytorch``). Not ``ft-suite``: the package index already
#: serves an unrelated project under that name, whose metadata :func:`version` would read.
DISTRIBUTION = "ft-suite-pytorch"
#: The version of a source tree that is not installed (PEP 440 local version: sorts below any release).
UNKNOWN_VERSION = "0+unknown"


@functools.cache
def version() -> str:
    """The installed ft-suite's version, or :data:`UNKNOWN_VERSION`."""
    from importlib import metadata  # here: its import alone costs ~15 ms of the launcher's start

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def torch_version() -> str:
    """The version of the torch this process imports (e.g. ``2.13.0a0+<hash>.nv``), or ``"not installed"``."""
    try:
        import torch
    except ImportError:
        return "not installed"
    return str(torch.__version__)


def version_line(program: str) -> str:
    """What ``--version`` prints: the program, ft-suite's version, and the Python and torch in use."""
    return f"{program} ({DISTRIBUTION}) {version()} (Python {python_version()}, torch {torch_version()})"


def __getattr__(name: str) -> str:
    """``__version__``: ft-suite's version (``ft_core.__version__``), read when asked for: the metadata lookup
    costs tens of milliseconds, and the launcher imports this module before its first workers start."""
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
