"""The package's metadata: one version everywhere, a licence, extras that add exactly what a feature imports: the tests that start processes."""

from __future__ import annotations

import subprocess
import sys

import torch
from helpers import python_env

import ft_core


def test_ft_launcher_version_names_ft_suite_python_and_torch():
    proc = subprocess.run([sys.executable, "-m", "ft_core.launcher", "--version"], env=python_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    python = ".".join(map(str, sys.version_info[:3]))
    assert proc.stdout.strip() == (f"ft_launcher (ft-suite-pytorch) {ft_core.__version__} (Python {python}, "
                                   f"torch {torch.__version__})")
