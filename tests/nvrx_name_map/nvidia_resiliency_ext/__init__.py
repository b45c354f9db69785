"""A stand-in ``nvidia_resiliency_ext`` whose names are ft-suite's: NVRx's own unit tests run against ours.

NVRx's tests are not on the package index (its sdist holds no tests), so they
run by hand on a checkout of nvidia-resiliency-ext (``git clone
https://github.com/NVIDIA/nvidia-resiliency-ext``): ``make test-nvrx-unit
NVRX=<checkout>``. With ``tests/nvrx_name_map`` on ``PYTHONPATH`` (inherited
by the ranks NVRx's tests spawn), each public name NVRx's tests import
resolves to ours, as the migration guide maps them; everything else (NVRx's
rank monitor server internals, launcher internals, private attributes) is
absent, so the tests that need it fail, and ``docs/migrating_from_nvrx.md``
("NVRx's own unit tests") lists each failure with its reason.

    cd <checkout>/tests/fault_tolerance/unit
    NVRX_SRC=<checkout>/src PYTHONPATH=<ft-suite>:<ft-suite>/tests/nvrx_name_map \\
        python -m pytest <the tests listed in the Makefile's NVRX_UNIT_TESTS>

The names are the product's import alias (``ft_integrations.nvrx_alias``: what a
Megatron-LM job imports); this package only adds the names NVRx's tests reach beyond
it: its launcher's argument parser, ``data.FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR``
(the variable's name). NVRx's own helper modules that its tests import and that are
no API of fault tolerance (``fault_tolerance.utils``: ``wait_for_mp_events``;
``shared_utils``) are NVRx's code, loaded unchanged from the checkout
(``NVRX_SRC``), never a stand-in of ours.
"""

from __future__ import annotations

import os
import sys
import types

from ft_integrations.nvrx_alias import SHIM_PATH

# The alias's nvidia_resiliency_ext holds the submodules: this package is that one, plus the launcher.
__path__.append(os.path.join(SHIM_PATH, "nvidia_resiliency_ext"))  # noqa: F821 (a package's __path__)


def install() -> None:
    """Add the names NVRx's tests import beyond the alias (see the module's docstring)."""
    import nvidia_resiliency_ext.fault_tolerance as fault_tolerance
    import nvidia_resiliency_ext.fault_tolerance.data as data
    from ft_core.jobdir import MONITOR_SOCKET_ENV
    from ft_core.launcher.cli import build_parser

    launcher = types.ModuleType(f"{fault_tolerance.__name__}.launcher")
    launcher.get_args_parser = build_parser
    sys.modules[launcher.__name__] = launcher
    fault_tolerance.launcher = launcher
    data.FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR = MONITOR_SOCKET_ENV
    nvrx_src = os.environ.get("NVRX_SRC")
    if nvrx_src:
        _load_nvrx_helpers(fault_tolerance, os.path.join(nvrx_src, "nvidia_resiliency_ext"))


def _load_nvrx_helpers(fault_tolerance: types.ModuleType, package_dir: str) -> None:
    """NVRx's ``shared_utils`` and ``fault_tolerance/utils.py`` from its checkout, unchanged (test helpers)."""
    import importlib.util

    __path__.append(package_dir)  # noqa: F821 (after ours: only what the alias does not serve comes from NVRx)
    name = f"{fault_tolerance.__name__}.utils"
    spec = importlib.util.spec_from_file_location(name, os.path.join(package_dir, "fault_tolerance", "utils.py"))
    assert spec is not None and spec.loader is not None
    utils = importlib.util.module_from_spec(spec)
    sys.modules[name] = utils
    spec.loader.exec_module(utils)
    fault_tolerance.utils = utils


install()
