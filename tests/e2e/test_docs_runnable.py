"""Every code block of the README and the docs pages marked ``<!-- runnable -->`` runs as it is and succeeds.

Each block runs in a fresh directory holding links to the repository's ``examples/``
and ``recipes/`` (the pages' relative paths), with ``ft_launcher`` on PATH (the
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
