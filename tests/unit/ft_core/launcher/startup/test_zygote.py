"""Which worker command lines the pre-warmed zygote can fork, and where they import from."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from ft_core.launcher.startup.zygote import (
    IDLE_PREWARM_AFTER,
    EntryKind,
    FactoryChannel,
    PythonInvocation,
    Retire,
    _readable,
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


def test_an_idle_factory_sees_no_request_until_one_is_sent_and_then_reads_it_whole():
    factory_end, launcher_end = socket.socketpair()
    factory, launcher = FactoryChannel(factory_end), FactoryChannel(launcher_end)
    try:
        assert not _readable(factory, 0.01)  # idle: the factory would import RESTART_PREWARMED now
        assert not _readable(factory, -1.0)  # a deadline already passed: no wait
        launcher.send(Retire())
        assert _readable(factory, 10.0)
        assert factory.recv(1.0) == (Retire(), [])
    finally:
        factory.close()
        launcher.close()
    assert IDLE_PREWARM_AFTER == 5.0  # the documented default (docs/launcher.md, "Pre-warmed workers")
