"""Shared fixtures: every test must leave no child process behind."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

#: Children may take a moment to be reaped after a test's own cleanup.
ORPHAN_GRACE_S = 15.0


def _live_descendants() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(autouse=True)
def no_orphan_processes():
    """Fail a test that leaves any process of its tree alive (and kill what it left)."""
    yield
    deadline = time.monotonic() + ORPHAN_GRACE_S
    leftovers = _live_descendants()
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.1)
        leftovers = _live_descendants()
    if leftovers:
        described = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in leftovers if p.is_running()]
        for proc in leftovers:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"test left processes alive: {described}")
