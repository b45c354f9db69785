"""Every code block of the README and the docs pages marked ``<!-- runnable -->`` runs as it is and succeeds.

Each block runs in a fresh directory holding links to the repository's ``examples/``
and ``recipes/`` (the pages' relative paths), with ``ft_launcher`` on PATH (the
project's launcher, as after ``. .venv/bin/activate``). Python blocks run with
``python -c``, bash blocks with ``bash -euo pipefail``.

A Python block marked ``<!-- runnable as NAME -->`` is a training script: it is written to
``NAME`` and run by the first ``ft_launcher`` command of the bash block after it, with its
flags as written (``--nproc-per-node`` lowered to 2: this machine has 2 cores).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from helpers import REPO_ROOT, python_env
from integration.launcher_helpers import run_job

from ft_core.event_file import read_events

PAGES = ["README.md"] + sorted(
    os.path.relpath(os.path.join(root, name), REPO_ROOT)
    for root, _, names in os.walk(os.path.join(REPO_ROOT, "docs")) for name in names if name.endswith(".md"))


def _blocks() -> list[tuple[str, str, str]]:
    """``(test id, language, code)`` of every runnable block; the id is the page and the section."""
    blocks = []
    for page in PAGES:
        with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as handle:
            text = handle.read()
        for match in re.finditer(r"<!-- runnable -->\n```(\w+)\n(.*?)```", text, flags=re.S):
            heading = re.findall(r"^#+ (.+)$", text[:match.start()], flags=re.M)[-1].strip("`: ").split()[0].lower()
            stem = os.path.splitext(os.path.basename(page))[0].lower()
            blocks.append((f"{stem}-{heading}-{len(blocks)}", match.group(1), match.group(2)))
    return blocks


BLOCKS = _blocks()


def test_the_docs_mark_their_complete_programs():
    assert {lang for _, lang, _ in BLOCKS} == {"python", "bash"} and len(BLOCKS) >= 3


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("lang", "code"), [b[1:] for b in BLOCKS], ids=[b[0] for b in BLOCKS])
def test_runnable_docs_block(tmp_path, lang, code):
    for name in ("examples", "recipes"):
        os.symlink(os.path.join(REPO_ROOT, name), tmp_path / name)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    for name, command in (("ft_launcher", f'{sys.executable} -m ft_core.launcher'), ("python", sys.executable)):
        (bin_dir / name).write_text(f'#!/bin/bash\nexec {command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = python_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONWARNINGS="ignore")
    for key in list(env):
        if key.startswith(("FT_", "SLURM_", "TORCHELASTIC_")) or key == "FAULT_TOL_FINISHED_FLAG_FILE":
            env.pop(key)
    command = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=380)
    assert result.returncode == 0, f"docs block failed:\n{code}\n{(result.stdout + result.stderr)[-4000:]}"


def _launched_scripts() -> dict[str, tuple[str, str, list[str]]]:
    """``{page-section: (file name, script, ft_launcher's arguments)}`` of every ``runnable as`` block."""
    scripts = {}
    for page in PAGES:
        with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as handle:
            text = handle.read()
        for match in re.finditer(r"<!-- runnable as (\S+) -->\n```python\n(.*?)```\s*```bash\n(.*?)```",
                                 text, flags=re.S):
            heading = re.findall(r"^#+ (.+)$", text[:match.start()], flags=re.M)[-1]
            command = shlex.split(match.group(3).replace("\\\n", " ").splitlines()[0], comments=True)
            assert command[0] == "ft_launcher" and command[-1] == match.group(1), command
            scripts[f"{page}: {heading}"] = (match.group(1), match.group(2), command[1:])
    return scripts


SCRIPTS = _launched_scripts()
README_PLAIN = SCRIPTS["README.md: Quickstart: plain PyTorch"]


def _launch(tmp_path, name: str, script: str, args: list[str], replace: dict[str, str]):
    """Run ``script`` as ``name`` under ft_launcher with ``args`` (each flag in ``replace`` changed): result, events."""
    (tmp_path / name).write_text(script)
    args = [replace.get(arg.split("=")[0], arg) for arg in args]
    log_dir = tmp_path / "logs"
    env = python_env(PYTHONWARNINGS="ignore")
    for key in list(env):
        if key.startswith(("FT_", "SLURM_", "TORCHELASTIC_")) or key == "FAULT_TOL_FINISHED_FLAG_FILE":
            env.pop(key)
    command = [sys.executable, "-m", "ft_core.launcher", f"--log-dir={log_dir}", *args]
    result = run_job(command, env, timeout=300, log_path=tmp_path / "launcher.out", cwd=tmp_path)
    return result, read_events(str(log_dir / "ft_events.jsonl"))[0]


def test_the_readme_plain_pytorch_quickstart_is_a_launched_script():
    assert README_PLAIN[2][-1] == "train.py" and "--ft-rank-out-of-section-timeout=600" in README_PLAIN[2]


@pytest.mark.timeout(400)
def test_readme_plain_pytorch_loop_with_its_flags_survives_an_evaluation_after_learning(tmp_path):
    # As written: learning at step 100 from microsecond gaps between steps, then 4 s outside any
    # section. NVRx's rule replaced the 600 s set at launch by ~1 s learned from those gaps.
    name, script, args = README_PLAIN
    result, events = _launch(tmp_path, name, script, args, {"--nproc-per-node": "--nproc-per-node=2"})
    assert not result.timed_out and result.returncode == 0, result.output[-6000:]
    assert [e for e in events if e["event"] in ("hang_detected", "restart")] == []
    section = torch.load(tmp_path / "ckpt.pt")["ft_state"]["current_timeouts"]["section"]
    assert section["calculated_sections"] == ["step"] and section["section"]["step"] < 300  # learned, and kept
    assert section["out_of_section"] >= 600


@pytest.mark.timeout(400)
def test_readme_plain_pytorch_loop_out_of_section_past_the_launch_value_is_still_caught(tmp_path):
    # The same loop, launched with 3 s out of section: its 4 s evaluation is a hang past the launch value.
    name, script, args = README_PLAIN
    result, events = _launch(tmp_path, name, script, args, {
        "--nproc-per-node": "--nproc-per-node=2", "--max-restarts": "--max-restarts=0",
        "--ft-rank-out-of-section-timeout": "--ft-rank-out-of-section-timeout=3"})
    assert not result.timed_out and result.returncode != 0, result.output[-6000:]
    hangs = [e for e in events if e["event"] == "hang_detected"]
    assert hangs and {(e["reason"], e["timeout"], e["iteration"]) for e in hangs} == {("out_of_section", 3.0, 100)}
