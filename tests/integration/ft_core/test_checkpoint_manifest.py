"""SIGKILL at 50 random instants of checkpoint saves: the checkpoint a resume picks is always whole.

A real process saves checkpoints in a loop (``checkpoint_workers/saver.py``: a step file
and ``last.ckpt`` overwritten in place, each through
``ft_core.checkpoint_manifest.save_file_atomically``, the function behind the Lightning
callback's checkpoint writes) and is SIGKILLed at a random instant, 50 times. After each
kill the resume's choice (``last.ckpt``, else the newest step file that verifies) must
be a checkpoint whose content is exactly what its manifest says was written.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO_ROOT, python_env

from ft_core.checkpoint_manifest import Version, first_accepted, verified_version

SAVER = os.path.join(REPO_ROOT, "tests", "integration", "checkpoint_workers", "saver.py")
SIZE = 4 << 20


def _newest_first(directory) -> list[str]:
    steps = sorted((int(n[5:-5]) for n in os.listdir(directory) if n.startswith("step=") and n.endswith(".ckpt")),
                   reverse=True)
    return [os.path.join(directory, "last.ckpt")] + [os.path.join(directory, f"step={s}.ckpt") for s in steps]


@pytest.mark.timeout(240)
def test_a_kill_at_any_instant_of_a_save_leaves_a_whole_checkpoint_to_resume_from(tmp_path):
    rng = random.Random(20)
    step = 0
    for kill in range(50):
        proc = subprocess.Popen([sys.executable, SAVER, str(tmp_path), str(SIZE), str(step)], env=python_env(),
                                stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline()  # at least one save done
            time.sleep(rng.uniform(0.0, 0.05))  # then anywhere in the next saves
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        chosen, rejected = first_accepted(_newest_first(tmp_path))
        assert chosen is not None, (kill, rejected)
        version = verified_version(chosen)
        assert isinstance(version, Version), (kill, version)
        with open(chosen, "rb") as handle:
            content = handle.read()
        # Whole, not torn, and the step the manifest vouches for is the step it holds.
        assert content == (b"%08d" % version.global_step) * (SIZE // 8), (kill, chosen)
        step = version.global_step
    # Nothing but checkpoints, their manifests and the temp files of the last killed writer only: at most
    # one for a checkpoint and one for its manifest (written inside the checkpoint's save, before its rename).
    # The temp files of every earlier killed writer were removed by the next save of the same file.
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(leftovers) <= 2 and all(f".{proc.pid}." in n for n in leftovers), (proc.pid, leftovers)
