"""The "training is finished" flag that ends an auto-resume loop."""

from __future__ import annotations

from ft_core.autoresume import (
    FINISHED_FLAG_ENV,
    finished_flag_path,
    mark_training_finished,
    training_finished,
)


def test_the_flag_is_the_file_the_variable_names_and_counts_only_once_it_exists(tmp_path):
    flag = tmp_path / "finished"
    environ = {FINISHED_FLAG_ENV: str(flag)}
    assert finished_flag_path(environ) == str(flag)
    assert not training_finished(environ)
    flag.touch()
    assert training_finished(environ)
    assert finished_flag_path({}) is None and finished_flag_path({FINISHED_FLAG_ENV: ""}) is None
    assert not training_finished({})


def test_marking_creates_the_file_and_its_directory(tmp_path, monkeypatch):
    flag = tmp_path / "a" / "b" / "finished"
    monkeypatch.setenv(FINISHED_FLAG_ENV, str(flag))
    assert not training_finished()
    assert mark_training_finished() == str(flag)
    assert flag.is_file() and training_finished()
    assert mark_training_finished() == str(flag)  # again: still there, no error


def test_marking_without_the_variable_does_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(FINISHED_FLAG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert mark_training_finished() is None
    assert list(tmp_path.iterdir()) == []
