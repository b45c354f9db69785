"""Lazy package exports (PEP 562): a package names its public API without importing it.

A rank that imports ``ft_core.client`` must not pay for the monitor server,
and the monitor must not import the client; yet ``from ft_core import X``
should work for every public ``X``. A package declares which module owns
each name and installs the two module hooks::

    __getattr__, __dir__ = lazy_exports(__name__, {"RankMonitorClient": "ft_core.client"}, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` hooks of ``package`` for ``exports`` (name -> owning module).

    A name is imported on first access and then cached in ``namespace`` (the
    package's ``globals()``), so later accesses are plain attribute lookups.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # resolve once
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
