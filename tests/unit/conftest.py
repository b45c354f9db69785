"""Unit tests run in this process only: starting a process here fails the test.

Tests that start processes (a monitor, a rank, a launcher, ``python -c``) belong under
``tests/integration`` at the same package path; this keeps ``tests/unit`` fast and free of
process races.
"""

from __future__ import annotations

import os
import subprocess

import pytest


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a unit test started a process: move it under tests/integration")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    monkeypatch.setattr(os, "posix_spawnp", refuse)
