"""Process titles (in a child process: the title is the process's own)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TITLE = """
import json, sys
import psutil
from ft_core.utils.procutil import set_process_title
set_process_title(json.loads(sys.stdin.read()))
with open("/proc/self/cmdline", "rb") as handle:
    raw = handle.read()
with open("/proc/self/comm") as handle:
    comm = handle.read().strip()
print(json.dumps({"raw": raw.decode(), "cmdline": psutil.Process().cmdline(), "comm": comm}))
"""


def _titled(title: list[str], padding: str) -> dict:
    # The child's own command line (python -c TITLE padding) is the room the title has.
    out = subprocess.run([sys.executable, "-c", TITLE, padding], input=json.dumps(title), capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def test_the_title_replaces_the_command_line_and_the_name():
    shown = _titled(["/opt/venv/bin/python3.11", "-u", "train.py", "--lr", "0.1"], padding="")
    assert shown["cmdline"] == ["/opt/venv/bin/python3.11", "-u", "train.py", "--lr", "0.1"]
    assert shown["raw"] == "/opt/venv/bin/python3.11 -u train.py --lr 0.1\0"  # no padding shown
    assert shown["comm"] == "python3.11"


def _room(padding: str) -> int:
    """The child's original command line, NUL-terminated arguments: the room a title has."""
    return sum(len(arg.encode()) + 1 for arg in [sys.executable, "-c", TITLE, padding])


def test_where_the_title_does_not_fit_the_program_is_named_by_its_base_name():
    args = ["-u", "train.py", "--lr", "0.1", "z" * (_room("") - 40)]
    shown = _titled(["/a/long/path/to/an/environment/bin/python3.11", *args], padding="")
    assert shown["cmdline"] == ["python3.11", *args]
    assert shown["comm"] == "python3.11"


@pytest.mark.parametrize("padding", ["", "x" * 50])
def test_a_title_longer_than_the_command_line_is_cut_to_its_length(padding):
    title = ["a-program-name-longer-than-fifteen-bytes", "y" * 2000]
    shown = _titled(title, padding)
    room = _room(padding)
    assert shown["raw"] == f"{title[0]} {'y' * (room - len(title[0]) - 2)}\0"
    assert shown["comm"] == title[0][:15]  # the kernel keeps 15 bytes of a name
