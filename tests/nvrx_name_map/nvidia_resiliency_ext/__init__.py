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
    PYTHONPATH=<ft-suite>:<ft-suite>/tests/nvrx_name_map python -m pytest \\
        test_config.py test_timeouts_calc.py test_rank_monitor_client.py

The names are the product's import alias (``ft_integrations.nvrx_alias``: what a
Megatron-LM job imports); this package only adds what NVRx's tests reach beyond
it, its launcher's argument parser.
"""

from __future__ import annotations

import os
import sys
import types

from ft_integrations.nvrx_alias import SHIM_PATH

# The alias's nvidia_resiliency_ext holds the submodules: this package is that one, plus the launcher.
__path__.append(os.path.join(SHIM_PATH, "nvidia_resiliency_ext"))  # noqa: F821 (a package's __path__)


def install() -> None:
    """Add ``nvidia_resiliency_ext.fault_tolerance.launcher`` (NVRx's tests build its parser) on top of the alias."""
    import nvidia_resiliency_ext.fault_tolerance as fault_tolerance
    from ft_core.launcher.cli import build_parser

    launcher = types.ModuleType(f"{fault_tolerance.__name__}.launcher")
    launcher.get_args_parser = build_parser
    sys.modules[launcher.__name__] = launcher
    fault_tolerance.launcher = launcher


install()
