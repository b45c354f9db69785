"""The core's public names are importable from the package top, and the submodule paths still work: the tests that start processes."""

import subprocess
import sys


def test_importing_the_client_does_not_import_the_monitor_server():
    code = "import sys, ft_core.client; print('ft_core.monitor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
