"""The Megatron-LM alias beside an installed NVRx: only ``fault_tolerance`` is ours, the rest stays NVIDIA's.

A stand-in NVRx (built here, with NVRx's layout and cross-imports) is put on
``PYTHONPATH`` after the alias, as an NVIDIA container has NVRx installed; each
check runs in a fresh interpreter, as a rank imports.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO_ROOT, python_env

from ft_integrations.nvrx_alias import SHIM_PATH

pytestmark = pytest.mark.timeout(180)

#: NVRx's files that matter here, in NVRx's layout; each module says it is the stand-in's.
_STANDIN = {
    "__init__.py": '__version__ = "9.9.9+standin"\n',
    "checkpointing/__init__.py": "",
    "checkpointing/local/__init__.py": "",
    "checkpointing/local/base_state_dict.py": "class TensorAwareStateDict:\n    STANDIN = True\n",
    # As NVRx's: importing inprocess imports fault_tolerance.rank_monitor_server, which imports .data and .config.
    "inprocess/__init__.py": "from . import nested_restarter\nfrom .wrap import Wrapper\n",
    "inprocess/wrap.py": "class Wrapper:\n    STANDIN = True\n",
    "inprocess/nested_restarter.py": "from ..fault_tolerance.rank_monitor_server import RankMonitorLogger\n",
    "fault_tolerance/__init__.py": "raise AssertionError(\"NVRx's fault_tolerance/__init__ ran instead of the alias's\")\n",
    "fault_tolerance/rank_monitor_client.py": "RankMonitorClient = 'standin'\n",
    "fault_tolerance/data.py": "class AuthkeyMsg:\n    STANDIN = True\n\nWorkloadAction = 'standin'\n",
    "fault_tolerance/rank_monitor_server.py": (
        "from .config import FaultToleranceConfig\nfrom .data import AuthkeyMsg\n\n"
        "class RankMonitorLogger:\n    MESSAGES = AuthkeyMsg\n    CONFIG = FaultToleranceConfig\n"),
}


def _standin(root: Path) -> Path:
    for name, text in _STANDIN.items():
        path = root / "nvidia_resiliency_ext" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _run(code: str, *path: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter with ``PYTHONPATH=<alias>:<path>...:<repo>``, as the job script sets it."""
    env = python_env()
    env["PYTHONPATH"] = ":".join([SHIM_PATH, *path, REPO_ROOT])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=150)


def test_beside_an_installed_nvrx_only_fault_tolerance_is_ours(tmp_path):
    standin = _standin(tmp_path / "site-packages")
    result = _run("""
        import ft_core.client, ft_core.data, ft_core.config
        import nvidia_resiliency_ext as nvrx
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
        from nvidia_resiliency_ext.fault_tolerance.rank_monitor_client import RankMonitorClient as Client
        from nvidia_resiliency_ext.fault_tolerance.data import WorkloadAction
        assert RankMonitorClient is Client is ft_core.client.RankMonitorClient
        assert WorkloadAction is ft_core.data.WorkloadAction
        assert nvrx.__version__ == "9.9.9+standin", nvrx.__version__
        # NVRx's other subpackages: its local checkpointing and its in-process restart (with NVRx's
        # rank_monitor_server, which imports NVRx's message classes through the alias's data module).
        from nvidia_resiliency_ext.checkpointing.local.base_state_dict import TensorAwareStateDict
        assert TensorAwareStateDict.STANDIN
        import nvidia_resiliency_ext.inprocess as inprocess
        assert inprocess.Wrapper.STANDIN
        logger = inprocess.nested_restarter.RankMonitorLogger
        assert logger.MESSAGES.STANDIN and logger.CONFIG is ft_core.config.FaultToleranceConfig
        # megatron-core's own detection of NVRx, as installed.
        from megatron.core.dist_checkpointing import tensor_aware_state_dict as mcore
        assert mcore.HAVE_NVRX and issubclass(mcore.MCoreTensorAwareStateDict, TensorAwareStateDict)
        print("ok", nvrx.__file__)
    """, str(standin))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", str(Path(SHIM_PATH) / "nvidia_resiliency_ext" / "__init__.py")]


def test_the_alias_alone_serves_fault_tolerance_and_nothing_else():
    result = _run("""
        import ft_core.client
        import nvidia_resiliency_ext as nvrx
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
        assert RankMonitorClient is ft_core.client.RankMonitorClient
        assert not hasattr(nvrx, "__version__")
        try:
            import nvidia_resiliency_ext.checkpointing
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("a checkpointing package without NVRx")
        from megatron.core.dist_checkpointing import tensor_aware_state_dict as mcore
        assert not mcore.HAVE_NVRX
        print("ok")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok"]
