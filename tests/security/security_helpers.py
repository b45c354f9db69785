"""Helpers of the security suite: raw connections to a live monitor and what it did with them."""

from __future__ import annotations

import os
import socket
import stat
import sys

from helpers import REPO_ROOT, wait_for

from ft_core.event_file import read_events

RANK_SCRIPT = os.path.join(REPO_ROOT, "tests", "integration", "core_workers", "rank.py")
BENCHMARKS = os.path.join(REPO_ROOT, "benchmarks")
TOKEN = "security-test-token-0123456789"
#: What a planted-symlink victim file holds; it must still hold it after the test.
VICTIM_TEXT = "a file of the victim's choice\n"


def connect(monitor) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(monitor.socket_path)
    return sock


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True if the peer closes ``sock`` within ``timeout`` (replies before the close are ignored)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def rejections(monitor) -> list[str]:
    return [e["reason"] for e in read_events(monitor.events_path)[0] if e["event"] == "connection_rejected"]


def wait_rejection(monitor, words: str, timeout: float = 15.0) -> str:
    return wait_for(lambda: next((r for r in rejections(monitor) if words in r), None), timeout,
                    f"a connection_rejected event mentioning {words!r}")


def assert_untouched(monitor, *procs) -> None:
    """The monitor serves, no rank was killed or asked for a stack dump, every rank still runs."""
    assert monitor.is_alive(), "the monitor died"
    events = read_events(monitor.events_path)[0]
    assert not [e for e in events if e["event"] in ("hang_detected", "rank_terminated")]
    assert all(proc.poll() is None for proc in procs)
    stacks = os.path.join(os.path.dirname(monitor.socket_path), "stacks")
    assert all(os.path.getsize(os.path.join(stacks, f)) == 0 for f in os.listdir(stacks))  # no SIGUSR2 dump


def import_benchmark(name: str):
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    return __import__(name)


def file_mode(path) -> int:
    """Permission bits of ``path`` itself (a symlink is not followed)."""
    return stat.S_IMODE(os.lstat(path).st_mode)
