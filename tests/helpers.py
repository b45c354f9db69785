"""Helpers for tests that start real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Optional

from ft_core.event_file import read_events

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def wait_for_event(events_path: str, timeout: float, **match: Any) -> dict[str, Any]:
    """The first event in ``events_path`` whose fields include ``match``."""

    def find() -> Optional[dict[str, Any]]:
        for event in read_events(events_path)[0]:
            if all(event.get(k) == v for k, v in match.items()):
                return event
        return None

    return wait_for(find, timeout, f"event {match} in {events_path}")


def python_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def spawn_python(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen:
    """Start ``python args...`` in its own process group so cleanup can kill the whole group."""
    return subprocess.Popen([sys.executable, *args], env=env, start_new_session=True, **kwargs)


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


#: A launch that stops at the torch-seam check (the script is never reached).
SEAM_CHECK_ARGS = ["--standalone", "--nproc-per-node", "1", "--ft-no-prewarm", "no_such_script.py"]


def killed(proc: subprocess.Popen, timeout: float = 60) -> bool:
    """Whether ``proc`` ends, within ``timeout`` seconds, killed by SIGKILL (as the monitor ends a hung rank)."""
    proc.wait(timeout=timeout)
    return proc.returncode == -9


def assert_one_seam_error(text: str, missing: str) -> None:
    """``text`` (the launcher's stderr) is the one clear error of a torch whose seam ``missing`` moved."""
    import torch

    from ft_core.launcher.seams import TESTED_TORCH

    assert "\nft_launcher: error: ft_launcher cannot run on torch " in f"\n{text}", text
    assert torch.__version__ in text
    assert missing in text
    assert f"tested with torch {', '.join(TESTED_TORCH)}" in text
    assert "Traceback" not in text
