"""A one-GPU worker for the CUDA tests (``make test-gpu``), under ft_launcher.

Each step multiplies two matrices on the rank's device, synchronises and heartbeats. When it starts,
every worker records its pid, cycle, whether it was pre-warmed and the device's free memory
(``torch.cuda.mem_get_info``, before it allocates anything of its own) to ``FT_TEST_RECORD``.

FT_TEST_STEPS        steps per cycle (default 20)
FT_TEST_CUDA_HANG    "1": in cycle 0, global rank 0 holds FT_TEST_CUDA_HOLD_MB of device memory and then
                     blocks in a CUDA synchronisation: a kernel that spins for minutes (``torch.cuda._sleep``)
                     and ``torch.cuda.synchronize()``, as a rank stuck behind a hung collective kernel is
FT_TEST_CUDA_HOLD_MB device memory the hanging rank holds (default 1024)
"""

from __future__ import annotations

import json
import os
import sys
import time

STARTED = time.time()
RANK = int(os.environ["RANK"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
CYCLE = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

#: Clock cycles the hanging kernel spins: minutes at any GPU clock, far past every timeout of the test.
SPIN_CYCLES = 10**12


def record(**fields) -> None:
    line = json.dumps({"pid": os.getpid(), "rank": RANK, "cycle": CYCLE, **fields}) + "\n"
    fd = os.open(os.environ["FT_TEST_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write: lines of concurrent workers never interleave
    finally:
        os.close(fd)


def hang_in_cuda_synchronize() -> None:
    import torch

    held = torch.empty(int(os.environ.get("FT_TEST_CUDA_HOLD_MB", "1024")) << 20, dtype=torch.uint8, device="cuda")
    record(event="hanging", held_bytes=held.numel(), time=time.time())
    torch.cuda._sleep(SPIN_CYCLES)
    torch.cuda.synchronize()  # blocks in the driver: no Python bytecode runs until the kernel ends


def main() -> int:
    prewarmed = "ft_core.launcher.startup.zygote" in sys.modules
    import torch

    from ft_core.client import RankMonitorClient

    torch.cuda.set_device(LOCAL_RANK % torch.cuda.device_count())
    free, total = torch.cuda.mem_get_info()
    record(event="started", time=STARTED, prewarmed=prewarmed, free_bytes=free, total_bytes=total)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()
    a = torch.randn(512, 512, device="cuda")
    for step in range(int(os.environ.get("FT_TEST_STEPS", "20"))):
        if step == 3 and CYCLE == 0 and RANK == 0 and os.environ.get("FT_TEST_CUDA_HANG") == "1":
            hang_in_cuda_synchronize()
        a = torch.tanh(a @ a)
        torch.cuda.synchronize()
        client.send_heartbeat()
        time.sleep(0.05)
    client.shutdown_workload_monitoring()
    record(event="finished", time=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
