"""An installed NVRx beside the alias: everything of it but what the alias serves stays NVIDIA's.

The alias's ``nvidia_resiliency_ext`` is first on ``PYTHONPATH``, so it is *the*
``nvidia_resiliency_ext``. In NVIDIA's containers NVRx is installed too, and
Megatron-LM uses more of it than ``fault_tolerance``: local checkpointing
(``checkpointing.local``), in-process restart (``inprocess``), megatron-core's NVRx
detection (``from nvidia_resiliency_ext.checkpointing.local.base_state_dict import
...``). So the alias's package search path continues into the installed package
(:func:`extend_with_installed`): a subpackage the alias does not hold is NVRx's own.

Inside ``fault_tolerance`` the alias's modules come first (``config``, ``data``,
``timeouts_calc``, ``rank_monitor_client``: the names a rank uses, served by
``ft_core``); NVRx's other modules of it (``rank_monitor_server``, ``utils``, ...)
are NVRx's, and so is a name one of the alias's modules lacks
(:func:`fallback_getattr`): NVRx's ``inprocess`` imports ``RankMonitorLogger`` from
its ``fault_tolerance.rank_monitor_server``, which imports NVRx's message classes
from ``.data``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from importlib.machinery import PathFinder
from types import ModuleType
from typing import Any, Optional

__all__ = ["extend_subpackage", "extend_with_installed", "fallback_getattr", "installed_package_dir"]

PACKAGE = "nvidia_resiliency_ext"


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def installed_package_dir(own_dir: str) -> Optional[str]:
    """The directory of the ``nvidia_resiliency_ext`` Python would import without the alias, or None.

    The first regular package on ``sys.path`` (as ``import`` finds it) that is not ``own_dir``.
    """
    entries = [entry for entry in sys.path
               if not _same_dir(os.path.join(entry or os.curdir, PACKAGE), own_dir)]
    spec = PathFinder.find_spec(PACKAGE, entries)
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None  # absent, or only a namespace portion: no NVRx installation
    return str(next(iter(spec.submodule_search_locations)))


def extend_with_installed(package: ModuleType) -> Optional[str]:
    """Append the installed NVRx's directory to the alias package's ``__path__``; run NVRx's ``__init__``.

    NVRx's ``__init__.py`` defines ``__version__`` (from its distribution's metadata) and
    nothing else; running it in the alias's namespace gives exactly NVRx's value (and any
    top-level name a later NVRx adds) without re-implementing its lookup. The alias's own
    ``__path__``, ``__file__`` and ``__doc__`` are kept. Returns the directory, or None.
    """
    real = installed_package_dir(os.path.dirname(package.__file__ or ""))
    if real is None:
        return None
    package.__path__.append(real)
    init = os.path.join(real, "__init__.py")
    kept = {name: package.__dict__[name] for name in ("__path__", "__file__", "__doc__", "__spec__")}
    with open(init, "rb") as handle:
        code = compile(handle.read(), init, "exec")
    exec(code, package.__dict__)  # noqa: S102 - NVRx's own __init__, as importing NVRx would run it
    package.__dict__.update(kept)
    return real


def extend_subpackage(subpackage: ModuleType) -> None:
    """Append the installed NVRx's directory of ``subpackage`` (e.g. its ``fault_tolerance``) to its ``__path__``.

    The parent's ``__path__`` (extended by :func:`extend_with_installed`) names the installed NVRx after the alias.
    """
    parent = sys.modules[subpackage.__name__.rpartition(".")[0]]
    own = os.path.dirname(subpackage.__file__ or "")
    leaf = subpackage.__name__.rpartition(".")[2]
    for directory in list(parent.__path__):
        candidate = os.path.join(directory, leaf)
        if os.path.isdir(candidate) and not _same_dir(candidate, own):
            subpackage.__path__.append(candidate)


def fallback_getattr(module_name: str) -> Callable[[str], Any]:
    """A module ``__getattr__``: a name the alias's module lacks comes from the installed NVRx's module.

    NVRx's module is loaded once, from its file, under a private name
    (``<package>._nvrx_<leaf>``), so that the alias's module keeps its name; its relative
    imports resolve in the same package as the alias's.
    """
    package_name, _, leaf = module_name.rpartition(".")
    own = os.path.dirname(sys.modules[module_name].__file__ or "")
    loaded: dict[str, ModuleType] = {}

    def real_module() -> Optional[ModuleType]:
        if "module" not in loaded:
            package = sys.modules[package_name]
            for directory in list(package.__path__):
                path = os.path.join(directory, f"{leaf}.py")
                if os.path.isfile(path) and not _same_dir(directory, own):
                    private = f"{package_name}._nvrx_{leaf}"
                    spec = importlib.util.spec_from_file_location(private, path)
                    assert spec is not None and spec.loader is not None
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[private] = module
                    try:
                        spec.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[private]
                        raise
                    loaded["module"] = module
                    break
            else:
                return None
        return loaded["module"]

    def __getattr__(name: str) -> Any:  # noqa: N807 - a module's __getattr__ (PEP 562)
        if not name.startswith("__"):
            real = real_module()
            if real is not None and hasattr(real, name):
                return getattr(real, name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
