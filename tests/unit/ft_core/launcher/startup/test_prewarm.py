"""Which jobs ft_launcher runs from a pre-warmed worker factory, and where it gives up with a warning."""

from __future__ import annotations

import importlib.util
import logging
import sys

from ft_core.launcher.startup.prewarm import WorkerFactory

PYTHON = sys.executable


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
