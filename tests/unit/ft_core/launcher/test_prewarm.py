"""Which worker command lines ft_launcher can fork from a pre-warmed factory, and where they import from."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

import pytest

from ft_core.launcher.prewarm import WorkerFactory
from ft_core.launcher.zygote import EntryKind, PythonInvocation

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


def test_for_job_gives_up_with_one_warning_where_forking_cannot_apply(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("PYTHON_EXEC", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("#!/bin/bash\necho hi\n")
    (tmp_path / "compiled.pyc").write_bytes(importlib.util.MAGIC_NUMBER + b"\0" * 12)
    assert WorkerFactory.for_job(PYTHON, ["-u", "train.py"], ["torch"]) is not None
    assert WorkerFactory.for_job(PYTHON, ["-u", "-m", "json.tool"], ["torch"]) is not None
    caplog.set_level(logging.WARNING, logger="ft_core.launcher")
    refused = [
        (str(tmp_path / "run.sh"), ["arg"]),  # --no-python with a shell script
        (PYTHON, ["-u", "run.sh"]),  # a shell script given to python: not Python source
        (PYTHON, ["-u", "compiled.pyc"]),
        (PYTHON, ["-u", "missing.py"]),
        (PYTHON, ["-u", str(tmp_path)]),  # a directory with __main__.py
        (print, ["arg"]),  # --run-path: a function, started by torch's multiprocessing
    ]
    for entrypoint, args in refused:
        caplog.clear()
        assert WorkerFactory.for_job(entrypoint, args, ["torch"]) is None
        assert [r.getMessage().startswith("pre-warmed workers off") for r in caplog.records] == [True]
    assert WorkerFactory.for_job(PYTHON, ["-u", "train.py"], ["torch"], numa_options=object()) is None
