"""The worker of memory_overhead.py: what a rank holds before training, then sleep until stopped.

It imports torch; under ft_launcher it also connects a RankMonitorClient (its
import and connection are part of ft's cost). With ``FT_BENCH_TRAIN_STEPS``
it first trains a small MLP for that many steps (a forked worker then no
longer shares what training touched). Then it writes its pid to
``$FT_BENCH_READY_DIR/ready_<RANK>`` and sleeps.
"""

import os
import signal

import torch  # noqa: F401 - every rank of a real job has it

if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
    from ft_core.client import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()
steps = int(os.environ.get("FT_BENCH_TRAIN_STEPS", "0"))
if steps:  # a little training first: it touches (and unshares) what a real step would
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        loss = model(torch.randn(32, 256)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
            client.send_heartbeat()
path = os.path.join(os.environ["FT_BENCH_READY_DIR"], f"ready_{os.environ['RANK']}")
with open(path + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(path + ".tmp", path)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    signal.pause()
