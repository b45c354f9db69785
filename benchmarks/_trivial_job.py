"""The job of startup.py: the least a torch.distributed job does (import, join, one all_reduce, leave).

With ``FT_BENCH_STARTED_FILE`` set, each rank first appends the moment it started running (before its
imports) to that file: startup.py reads launch -> first rank running from it.
"""

import os
import time

if os.environ.get("FT_BENCH_STARTED_FILE"):
    _fd = os.open(os.environ["FT_BENCH_STARTED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(_fd, f"{time.time()}\n".encode())  # one write: concurrent ranks' lines never interleave
    os.close(_fd)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert value.item() == dist.get_world_size()
dist.destroy_process_group()
