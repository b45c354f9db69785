"""ft-suite installed from its wheel, not editable, beside a torch that is not the local CPU wheel's.

``make test-torch214`` creates a fresh venv holding only torch 2.14.1 and points
``FT_WHEEL_VENV`` at it; without that variable these tests are skipped. They
build the wheel from a copy of the files a release is built from, install it
with the ``lightning``, ``metrics`` and ``report`` extras (pip must keep the
venv's torch), and run everything from a scratch directory with no repository
on the path: ``ft_launcher --version``, a 2-rank job whose rank hangs (caught,
restarted, exit 0) with the metrics endpoint on, ``ft_launcher report --plot``
on its log, and a Lightning ``Trainer(callbacks=[FaultToleranceCallback()])``.
A module or data file missing from the wheel fails one of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO_ROOT

VENV = os.environ.get("FT_WHEEL_VENV")
pytestmark = [pytest.mark.skipif(not VENV, reason="needs FT_WHEEL_VENV: a fresh venv with a torch (make "
                                                  "test-torch214)"),
              pytest.mark.timeout(600)]

#: What a release is built from (pyproject.toml's packages and files).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "ft_core", "ft_integrations")

HANG_SCRIPT = """\
import os, time
from ft_core.client import RankMonitorClient

client = RankMonitorClient()
client.init_workload_monitoring()
for step in range(20):
    client.send_heartbeat()
    if step == 5 and os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        time.sleep(600)  # hangs in the first cycle only
    time.sleep(0.05)
client.shutdown_workload_monitoring()
"""

LIGHTNING_SCRIPT = """\
import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from ft_integrations.lightning import FaultToleranceCallback

trainer = pl.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[FaultToleranceCallback()])
trainer.fit(BoringModel())
print("trained", trainer.global_step)
"""


def _clean_env() -> dict[str, str]:
    """This environment without anything that would put the repository or our venv on the path."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PATH"] = f"{VENV}/bin:" + env.get("PATH", "")
    return env


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)


def _torch_version() -> str:
    proc = _run([f"{VENV}/bin/python", "-c", "import torch; print(torch.__version__)"], Path("/"))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """ft-suite's wheel, built from a copy of the release sources."""
    build = tmp_path_factory.mktemp("build")
    for name in SOURCES:
        source = Path(REPO_ROOT, name)
        if source.is_dir():
            shutil.copytree(source, build / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, build / name)
    wheels = tmp_path_factory.mktemp("wheels")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(wheels), str(build)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [built_wheel] = wheels.glob("ft_suite_pytorch-*.whl")
    return built_wheel


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, wheel) -> Path:
    """The wheel installed into ``FT_WHEEL_VENV``; a scratch working directory outside the repository."""
    torch_before = _torch_version()
    assert not torch_before.startswith(_local_torch()), "FT_WHEEL_VENV must hold another torch than the local one"
    installed = _run([f"{VENV}/bin/python", "-m", "pip", "install", "-q", f"{wheel}[lightning,metrics,report]"],
                     wheel.parent, timeout=600)
    assert installed.returncode == 0, installed.stderr
    assert _torch_version() == torch_before  # pip kept the environment's torch
    return tmp_path_factory.mktemp("scratch")


def _local_torch() -> str:
    import torch

    return str(torch.__version__).split("+")[0]


def test_the_installed_package_is_the_wheel_and_says_its_version(scratch):
    where = _run([f"{VENV}/bin/python", "-c", "import ft_core, ft_integrations; print(ft_core.__file__); "
                  "print(ft_core.__version__)"], scratch)
    assert where.returncode == 0, where.stderr
    path, version = where.stdout.split()
    assert Path(path).is_relative_to(Path(VENV, "lib")), path  # the venv's site-packages, not the sources
    proc = _run([f"{VENV}/bin/ft_launcher", "--version"], scratch)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"ft_launcher (ft-suite-pytorch) {version} (Python ")
    assert f"torch {_torch_version()}" in proc.stdout
    licence = _run([f"{VENV}/bin/python", "-c", "from importlib import metadata; "
                    "print(metadata.metadata('ft-suite-pytorch')['License-Expression'])"], scratch)
    assert licence.stdout.strip() == "Apache-2.0"


def test_a_hung_rank_is_caught_and_restarted_then_the_report_reads_the_log(scratch):
    (scratch / "hang.py").write_text(HANG_SCRIPT)
    events = scratch / "logs" / "ft_events.jsonl"
    proc = _run([f"{VENV}/bin/ft_launcher", "--nproc-per-node=2", "--max-restarts=1", "--ft-metrics-port=0",
                 "--ft-rank-heartbeat-timeout=3", f"--ft-events-file={events}", "hang.py"], scratch)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "metrics endpoint: http://" in proc.stderr  # the metrics extra is installed and serves
    records = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    hangs = [r for r in records if r["event"] == "hang_detected"]
    assert [(h["rank"], h["reason"]) for h in hangs] == [(1, "heartbeat")], proc.stderr[-6000:]
    assert [r["kind"] for r in records if r["event"] == "restart"] == ["hang"]
    report = _run([f"{VENV}/bin/ft_launcher", "report", str(events.parent), "--plot", "timeline.png"], scratch)
    assert report.returncode == 0, report.stderr
    assert (scratch / "timeline.png").stat().st_size > 0  # the report extra (matplotlib) draws it


def test_a_lightning_trainer_with_the_callback_runs_under_ft_launcher(scratch):
    (scratch / "fit.py").write_text(textwrap.dedent(LIGHTNING_SCRIPT))
    proc = _run([f"{VENV}/bin/ft_launcher", "--nproc-per-node=1", "--max-restarts=0", "fit.py"], scratch)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "trained 8" in proc.stdout


def test_pip_keeps_an_nvidia_container_torch(wheel, tmp_path):
    # NVIDIA's containers ship local pre-release builds; the (metadata of the) one of a 2.12 container.
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=120)
    site = next((tmp_path / "venv" / "lib").glob("python3.*/site-packages"))
    dist_info = site / "torch-2.12.0a0+ecf3bae40a.nv25.6.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0a0+ecf3bae40a.nv25.6\n")
    (dist_info / "RECORD").write_text("")
    proc = _run([str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "install", "--dry-run", str(wheel)],
                tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    would_install = next(line for line in proc.stdout.splitlines() if line.startswith("Would install"))
    packages = {name.rpartition("-")[0].lower() for name in would_install.split()[2:]}  # "<name>-<version>"
    assert "ft-suite-pytorch" in packages and "torch" not in packages, would_install
