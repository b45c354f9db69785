"""Which worker command lines a worker factory can fork, where they import from, and the channel's frames."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from ft_core.launcher.startup.factory_protocol import (
    EntryKind,
    FactoryChannel,
    Fork,
    PythonInvocation,
    Retire,
)

PYTHON = sys.executable


@pytest.mark.parametrize(("argv", "expected"), [
    ([PYTHON, "-u", "train.py", "--lr", "0.1"], (EntryKind.SCRIPT, "train.py", ["--lr", "0.1"], True)),
    ([PYTHON, "-u", "-m", "pkg.train", "-x"], (EntryKind.MODULE, "pkg.train", ["-x"], True)),
    ([PYTHON, "train.py"], (EntryKind.SCRIPT, "train.py", [], False)),
    ([PYTHON, "-u", "-X", "dev", "train.py"], None),  # interpreter options torchrun never adds
    ([PYTHON, "-u", "-m"], None),
    ([PYTHON, "-u"], None),
    (["/usr/bin/numactl", "--cpunodebind=0", PYTHON, "-u", "train.py"], None),
    (["./train.sh", "arg"], None),
])
def test_parse_accepts_only_what_torchrun_builds(argv, expected):
    parsed = PythonInvocation.parse(PYTHON, argv)
    if expected is None:
        assert parsed is None
    else:
        assert parsed is not None and (parsed.kind, parsed.target, parsed.args, parsed.unbuffered) == expected


def test_path0_is_the_real_script_directory_or_the_working_directory(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text("pass\n")
    os.symlink(tmp_path / "real" / "train.py", tmp_path / "link.py")
    script = PythonInvocation.parse(PYTHON, [PYTHON, "-u", "link.py"])
    module = PythonInvocation.parse(PYTHON, [PYTHON, "-u", "-m", "pkg"])
    assert script is not None and module is not None
    assert script.path0(str(tmp_path)) == str(tmp_path / "real")  # as python resolves symlinks
    assert module.path0(str(tmp_path)) == str(tmp_path)


def test_a_fork_request_travels_whole_with_its_descriptors():
    launcher_end, factory_end = socket.socketpair()
    launcher, factory = FactoryChannel(launcher_end), FactoryChannel(factory_end)
    read, write = os.pipe()
    try:
        invocation = PythonInvocation.parse(PYTHON, [PYTHON, "-u", "train.py", "--lr", "0.1"])
        assert invocation is not None
        request = Fork(invocation, {"RANK": "3", "BIG": "x" * 100_000}, "/tmp", [PYTHON, "-u", "train.py"])
        launcher.send(request, [read, write, read])  # stdin, stdout, stderr: the most a frame carries
        received = factory.recv(10.0)
        assert received is not None
        message, fds = received
        assert message == request and len(fds) == 3
        for fd in fds:
            os.close(fd)
        launcher.send(Retire())
        assert factory.recv(10.0) == (Retire(), [])
        launcher.close()
        assert factory.recv(10.0) is None  # the launcher closed the channel
    finally:
        factory.close()
        launcher.close()
        os.close(read)
        os.close(write)
