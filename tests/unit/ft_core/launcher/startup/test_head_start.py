"""The launcher's head start: the worker factory it guesses before its imports is the one the job needs, or none;
which modules of the script directory a factory forked from the launcher would shadow.

The processes (a guessed factory started, adopted or stopped) are in tests/integration/ft_core/launcher/startup/test_head_start.py.
"""

from __future__ import annotations

import os
import sys

import pytest

from ft_core.launcher import cli
from ft_core.launcher.startup.head_start import guess_factory, shadowed_modules
from ft_core.launcher.startup.prewarm import WorkerFactory


@pytest.fixture
def job_dir(tmp_path, monkeypatch):
    """A working directory with a training script and package, and no torchrun settings from the environment."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("print('train')\n")
    for name in [name for name in os.environ if name.startswith("PET_")] + ["PYTHON_EXEC"]:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _wanted(argv: list[str], monkeypatch) -> WorkerFactory:
    """The factory ``launch`` asks for after the real parse (torchrun's parser and its change to the environment)."""
    launched = {}

    def launch(config, entrypoint, cmd_args, loaded, options, *, head_start):
        launched["factory"] = WorkerFactory.for_job(entrypoint, cmd_args, options.prewarm_modules,
                                                    config.numa_options, env=dict(os.environ))
        return 0

    monkeypatch.setattr(cli, "launch", launch)
    assert cli.main(argv) == 0
    assert launched["factory"] is not None
    return launched["factory"]


@pytest.mark.parametrize("omp", [None, "4"])
@pytest.mark.parametrize("argv", [
    ["--standalone", "--nproc-per-node=2", "train.py", "--lr", "0.1", "-m", "x.py"],
    ["--nproc_per_node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "train.py"],
    ["--standalone", "--nproc-per-node=1", "--ft-prewarm=on", "train.py"],  # torchrun leaves OMP_NUM_THREADS alone
    ["--standalone", "--ft-prewarm-modules", "json,torch", "--nproc-per-node", "3", "-m", "pkg.train", "-x"],
    ["--standalone", "--nproc-per-node=2", "--ft-cfg-path", "ft.yaml", "--module", "pkg.train"],
])
def test_the_guess_is_the_factory_the_parsed_command_line_asks_for(job_dir, monkeypatch, argv, omp):
    (job_dir / "ft.yaml").write_text("fault_tolerance: {}\n")
    monkeypatch.setenv("OMP_NUM_THREADS", omp or "")  # recorded, so torchrun's own change is undone
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS")
    guess = guess_factory(argv)
    assert guess is not None and not guess.started
    assert guess.differences(_wanted(argv, monkeypatch)) == []


@pytest.mark.parametrize("argv", [
    ["--standalone", "--ft-no-prewarm", "train.py"],
    ["--standalone", "--ft-prewarm=off", "train.py"],
    ["--standalone", "--ft_prewarm", "off", "train.py"],
    ["--standalone", "--no-python", "train.py"],
    ["--standalone", "--run-path", "train.py"],
    ["--standalone", "train"],  # not a .py file: torchrun's parser alone knows what it is
    ["--standalone", "missing.py"],
    ["--standalone", "--", "train.py"],
    ["--standalone", "-m"],
    ["--standalone", "--ft-prewarm"],  # the launcher's parser reports this, not the guess
    ["--help"],
    [],
])
def test_no_guess_where_prewarming_is_off_or_the_command_line_is_unclear(job_dir, argv, capsys):
    assert guess_factory(argv) is None
    assert capsys.readouterr() == ("", "")


def test_shadowed_modules_are_the_ones_a_new_interpreter_would_find_in_the_script_directory(tmp_path, monkeypatch):
    import hmac  # noqa: F401 - imported here from the standard library, as by the launcher
    import json  # noqa: F401
    import secrets  # noqa: F401

    (tmp_path / "json.py").write_text("")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "__init__.py").write_text("")
    (tmp_path / "hmac").mkdir()  # no __init__.py: a namespace portion comes after every regular module
    (tmp_path / "os.py").write_text("")  # frozen, and sys built in: both found before any directory
    (tmp_path / "sys.py").write_text("")
    (tmp_path / "not_imported_here.py").write_text("")
    (tmp_path / "notes.so.txt").write_text("")
    # A module imported from the script directory itself is the one a worker would import.
    (tmp_path / "ft_test_local_module.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ft_test_local_module", raising=False)
    import ft_test_local_module  # noqa: F401

    assert shadowed_modules(str(tmp_path)) == ["json", "secrets"]
    assert shadowed_modules(str(tmp_path / "missing")) == []
