"""The torch elastic seams ``ft_launcher`` builds on: checked by the package at start, one clear error if moved: the tests that start processes."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO_ROOT, SEAM_CHECK_ARGS, assert_one_seam_error, python_env


def test_a_seam_the_cli_imports_is_checked_before_it_is_imported():
    # In a fresh process: without the check first, `import ft_core.launcher.cli` would die of an ImportError.
    code = ("import sys, torch.distributed.run as run; del run.parse_min_max_nnodes\n"
            "from ft_core.launcher import main\n"
            f"sys.exit(main({SEAM_CHECK_ARGS!r}))")
    proc = subprocess.run([sys.executable, "-c", code], env=python_env(), cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert_one_seam_error(proc.stderr, "torch.distributed.run.parse_min_max_nnodes is gone")
    assert "ft_core.launcher.cli" not in proc.stderr
