"""Records what a worker process looks like from inside, for comparing pre-warmed and plain starts.

Writes ``$FT_TEST_RECORD_DIR/probe_r<RANK>_c<cycle>.json``; then, in cycle 0, the rank named by
``FT_TEST_RAISE_RANK`` raises an uncaught exception (its traceback goes to its stderr).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading

_PR_GET_PDEATHSIG = 2


def parent_death_signal() -> int:
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value


def stream(name: str) -> dict:
    text = getattr(sys, name)
    return {"class": type(text.buffer).__name__, "raw": type(getattr(text.buffer, "raw", text.buffer)).__name__,
            "name": getattr(getattr(text.buffer, "raw", text.buffer), "name", None),
            "line_buffering": text.line_buffering, "write_through": text.write_through,
            "encoding": text.encoding, "errors": text.errors, "same_as_dunder": text is getattr(sys, f"__{name}__")}


def descriptors() -> list[str]:
    """What each open descriptor leads to (its kind for pipes, sockets and the like, else its file's name)."""
    found = []
    for fd in sorted(map(int, os.listdir("/proc/self/fd"))):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir used, closed since
            continue
        found.append(f"{fd}:{os.path.basename(target.partition(':[')[0])}")
    return found


def main() -> None:
    import numpy
    import psutil
    import torch

    # Before anything of the script uses torch: what the factory had imported (torch.optim's first step imports it).
    dynamo = "torch._dynamo" in sys.modules
    main_module = sys.modules["__main__"]
    umask = os.umask(0)
    os.umask(umask)
    record = {
        "prewarmed": "ft_core.launcher.startup.zygote" in sys.modules, "dynamo": dynamo,
        "name": __name__, "file": __file__, "argv": sys.argv, "orig_argv": sys.orig_argv[1:],
        "path0": sys.path[0], "path": sys.path[1:], "cwd": os.getcwd(),
        "main_is_module": main_module.__dict__ is globals(), "spec": __spec__,
        "loader": type(__loader__).__name__, "cached": __cached__, "builtins": type(__builtins__).__name__,
        "pid": os.getpid(), "ppid": os.getppid(), "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "sid_is_pid": os.getsid(0) == os.getpid(), "pdeathsig": parent_death_signal(),
        "env": dict(os.environ), "stdin": stream("stdin"), "stdout": stream("stdout"), "stderr": stream("stderr"),
        "fd1": os.readlink("/proc/self/fd/1"), "fd2": os.readlink("/proc/self/fd/2"),
        "umask": umask, "python_threads": threading.active_count(),
        "sigint": getattr(signal.getsignal(signal.SIGINT), "__name__", str(signal.getsignal(signal.SIGINT))),
        "sigterm": str(signal.getsignal(signal.SIGTERM)), "sigpipe": str(signal.getsignal(signal.SIGPIPE)),
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "torch_seed": torch.initial_seed(), "numpy_draw": int(numpy.random.randint(1 << 30)),
        # What torch's OpenMP read from the environment when its library loaded.
        "torch_threads": torch.get_num_threads(), "root_handlers": len(logging.root.handlers),
        "fds": descriptors(),
        # What `ps`, `pgrep` and `pkill` see.
        "cmdline": psutil.Process().cmdline(), "comm": psutil.Process().name(),
    }
    cycle = os.environ["TORCHELASTIC_RESTART_COUNT"]
    path = os.path.join(os.environ["FT_TEST_RECORD_DIR"], f"probe_r{os.environ['RANK']}_c{cycle}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)
    print(f"probe rank {os.environ['RANK']} on stdout")
    print(f"probe rank {os.environ['RANK']} on stderr", file=sys.stderr)
    if cycle == "0" and os.environ.get("FT_TEST_RAISE_RANK") == os.environ["RANK"]:
        # Raise only once every rank has recorded itself: the launcher then stops them all.
        from ft_core.utils.deadline import wait_until

        others = [os.path.join(os.path.dirname(path), f"probe_r{rank}_c0.json")
                  for rank in range(int(os.environ["WORLD_SIZE"]))]
        wait_until(lambda: all(os.path.exists(other) for other in others), timeout=120)
        fail(int(os.environ["RANK"]))


def fail(rank: int) -> None:
    raise ValueError(f"probe failure on rank {rank}")


if __name__ == "__main__":
    main()
