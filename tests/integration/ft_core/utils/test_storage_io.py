"""Which open files count as storage I/O: real processes, real files, pipes and redirections."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import wait_for

from ft_core.utils.storage_io import storage_sample

#: A child that opens ARGV[1] for writing, writes 3 bytes, says so on stdout and waits for stdin to close.
CHILD = ("import sys\nf = open(sys.argv[1], 'wb'); f.write(b'abc'); f.flush()\n"
         "print('written', flush=True); sys.stdin.read()\n")


def _files(sample):
    """The sample as {(pid, path): (pos, size, writable)}."""
    found = {}
    for key, offset in sample.items():
        try:
            path = os.readlink(f"/proc/{key.pid}/fd/{key.fd}")
        except OSError:
            continue
        found[key.pid, path] = tuple(offset)
    return found


def test_regular_files_count_whether_read_or_written_and_pipes_logs_and_pseudo_files_do_not(tmp_path):
    written, read, log = tmp_path / "ckpt", tmp_path / "data", tmp_path / "train.log"
    read.write_bytes(b"y" * 1000)
    read_pipe, write_pipe = os.pipe()
    with open(written, "wb") as w, open(read, "rb", buffering=0) as r, open(log, "a") as lg, open("/proc/self/stat", "rb") as p:
        w.write(b"x" * 100)
        w.flush()
        r.read(10)
        lg.write("a log line\n")
        lg.flush()
        p.read()
        os.write(write_pipe, b"through a pipe")
        files = {path: offset for (pid, path), offset in _files(storage_sample(os.getpid())).items()
                 if pid == os.getpid()}
    os.close(read_pipe)
    os.close(write_pipe)
    assert files[str(written)] == (100, 100, True)
    assert files[str(read)] == (10, 1000, False)
    assert str(log) not in files  # append mode: a log
    assert not [path for path in files if path.startswith(("pipe:", "/proc/", "/dev/"))]


def test_a_childs_files_count_and_stdout_redirected_to_a_file_does_not(tmp_path):
    stdout_file = tmp_path / "rank.out"
    with open(stdout_file, "w") as out:  # as torchrun --redirects does: stdout is a regular file
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "async_ckpt")], stdin=subprocess.PIPE,
                                 stdout=out, stderr=out)
    try:
        wait_for(lambda: stdout_file.read_text() == "written\n", 30, "the child to write")
        files = _files(storage_sample(os.getpid()))
        assert files[child.pid, str(tmp_path / "async_ckpt")] == (3, 3, True)  # a descendant's file counts
        assert (child.pid, str(stdout_file)) not in files  # its stdout does not
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_process_gone_gives_no_evidence_and_no_error():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert storage_sample(child.pid) == {}
