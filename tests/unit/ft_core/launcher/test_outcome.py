"""How a launcher ends: the exit code SLURM requeues by, why, and what becomes of the rendezvous."""

from __future__ import annotations

import signal

import pytest

from ft_core.autoresume import FINISHED_FLAG_ENV
from ft_core.launcher.outcome import (
    EXIT_CODES,
    LEFT_UNFINISHED_EXIT_CODE,
    exit_codes_help,
    exit_codes_markdown,
    exit_status,
    left_job_outcome,
    signal_outcome,
)


@pytest.fixture
def finished_flag(tmp_path, monkeypatch):
    flag = tmp_path / "finished"
    monkeypatch.setenv(FINISHED_FLAG_ENV, str(flag))
    return flag


def test_exit_status_tells_an_exit_code_from_a_signal():
    assert exit_status(0) == (0, None) and exit_status(3) == (3, None)
    assert exit_status(-signal.SIGKILL) == (None, "SIGKILL")


def test_a_node_that_left_an_unfinished_job_asks_for_a_requeue_and_never_exits_0(finished_flag):
    outcome = left_job_outcome("excluded")
    assert (outcome.exit_code, outcome.rendezvous) == (LEFT_UNFINISHED_EXIT_CODE, "leave")
    assert outcome.reason == "excluded; this node left an unfinished job"
    finished_flag.touch()
    outcome = left_job_outcome("excluded")
    assert (outcome.exit_code, outcome.rendezvous) == (0, "leave")
    assert outcome.reason == f"excluded; training is finished ({finished_flag} exists)"


def test_a_signal_exits_128_plus_n_unless_training_or_every_worker_finished(finished_flag):
    outcome = signal_outcome(signal.SIGTERM, "forwarded to the workers")
    assert (outcome.exit_code, outcome.rendezvous) == (143, "keep")
    assert outcome.reason == "SIGTERM received; training not finished (forwarded to the workers)"
    assert signal_outcome(signal.SIGINT, "x", workers_finished=True).exit_code == 0
    finished_flag.touch()
    outcome = signal_outcome(signal.SIGTERM, "forwarded to the workers")
    assert (outcome.exit_code, outcome.rendezvous) == (0, "keep")


def test_the_exit_code_table_and_the_help_list_the_same_codes():
    markdown = exit_codes_markdown()
    assert markdown.startswith("| code | when |\n|---|---|\n")
    assert [line.split(" | ")[0].lstrip("| ") for line in markdown.splitlines()[2:]] == [
        row.code for row in EXIT_CODES]
    help_text = exit_codes_help(width=60)
    assert help_text.startswith("exit codes:\n") and "`" not in help_text and "**" not in help_text
    assert all(len(line) <= 60 for line in help_text.splitlines())
    assert [line.split()[0] for line in help_text.splitlines()[1:] if not line.startswith(" " * 9)] == [
        row.code for row in EXIT_CODES]
