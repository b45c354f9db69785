"""A rank's own records land in its job's monitor event file, typed; without a monitor nothing is written."""

from ft_core.event_file import read_records
from ft_core.events import CheckpointLoaded
from ft_core.jobdir import MONITOR_SOCKET_ENV, JobDir
from ft_core.rank_records import current_cycle, write_rank_record


def test_a_record_goes_to_the_monitor_event_file_of_the_socket_job(tmp_path, monkeypatch):
    job = tmp_path / "job"
    job.mkdir(mode=0o700)
    socket_path = str(job / "monitor.sock")
    monkeypatch.setenv(MONITOR_SOCKET_ENV, socket_path)
    record = CheckpointLoaded(rank=1, cycle=2, checkpoint="/c/step=20.ckpt", step=20, time=5.0)
    assert write_rank_record(record)
    records, _ = read_records(JobDir.of_socket(socket_path).monitor_events)
    assert records == [record]


def test_without_a_monitor_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(MONITOR_SOCKET_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert not write_rank_record(CheckpointLoaded(rank=0, cycle=0, checkpoint="x", time=1.0))
    assert list(tmp_path.iterdir()) == []


def test_the_cycle_is_the_restart_count(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert current_cycle() == 3
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "junk")
    assert current_cycle() == 0
