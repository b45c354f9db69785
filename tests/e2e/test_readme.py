"""Every README code block marked ``<!-- runnable -->`` runs as it is and succeeds.

Each block runs in a fresh directory holding links to the repository's ``examples/``
and ``recipes/`` (the README's relative paths), with ``ft_launcher`` on PATH (the
project's launcher, as after ``. .venv/bin/activate``). Python blocks run with
``python -c``, bash blocks with ``bash -euo pipefail``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, python_env

README = open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"<!-- runnable -->\n```(\w+)\n(.*?)```", README, flags=re.S)


def _heading(code: str) -> str:
    """The README section of a block: its test id."""
    before = README[:README.index(code)]
    return re.findall(r"^#+ (.+)$", before, flags=re.M)[-1].strip("`: ").split()[0].lower()


def test_the_readme_marks_its_complete_programs():
    assert {lang for lang, _ in BLOCKS} == {"python", "bash"} and len(BLOCKS) >= 3


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("lang", "code"), BLOCKS, ids=[f"{_heading(c)}-{i}" for i, (_, c) in enumerate(BLOCKS)])
def test_runnable_readme_block(tmp_path, lang, code):
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
    assert result.returncode == 0, f"README block failed:\n{code}\n{(result.stdout + result.stderr)[-4000:]}"
