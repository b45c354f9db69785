"""Overhead of FaultToleranceCallback on a Lightning training step, paired (prints JSON).

A small model whose training step takes ``--step-ms`` (a sleep stands in for compute) is
trained by one ``Trainer.fit`` per mode (``heartbeats``, ``sections``) against a real rank
monitor (``RankMonitorServer.run_in_subprocess``). Inside that one fit, blocks of
``--block`` steps run with the callback and without it, interleaved: each round is three
blocks, one with the callback and two without, the callback's block first, second or third
in turn. The callback is taken out of ``trainer.callbacks`` between blocks (with the
``DataPhaseStart`` it adds), so a block without it pays nothing of it, not even Lightning's
calls of its empty hooks. Every round gives:

* ``overhead_pct``: the block with the callback against the mean of the two without, in
  wall time per step (each block's median step: a step another process preempted does not
  count); median, mean, p1/p99 over the rounds, and the 95 % confidence interval of the
  median (bootstrap), whose half-width must be below the target for the figure to say
  anything (``resolved``);
* ``floor_pct``: the same estimator between the two blocks without the callback (what the
  method reports for no difference at all, in the same run);
* ``cpu_us_per_step``: this process's CPU time per step with the callback minus without (mean; the
  callback's own cost, free of the other processes' noise on a shared machine), and
  ``monitor_cpu_us_per_step``: the rank monitor's (another process; on a node with a core to
  spare it does not slow training);
* ``hook_us_per_step``: the time spent inside the callback's per-step hooks
  (``on_train_batch_start``, ``on_before_backward``, ``on_train_batch_end``).

Not under ``ft_launcher`` here, so ``snapshot_every="auto"`` is off: in-memory snapshots have
their own budget (2 % of the step, ``benchmarks/snapshot.py``); what a step without a snapshot
pays for them (a modulo and a clock read) is in the hooks' time.

    python benchmarks/lightning_overhead.py [--rounds 60] [--block 20] [--step-ms 20]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, host  # noqa: E402

from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.monitor import RankMonitorServer  # noqa: E402
from ft_integrations.lightning import FaultToleranceCallback  # noqa: E402
from ft_integrations.lightning.data_phase import DataPhaseStart  # noqa: E402

WARMUP_STEPS = 20
MODES = ("heartbeats", "sections")
#: Where the block with the callback sits in a round (the two others run without it).
POSITIONS = (0, 1, 2)
TARGET_PCT = 0.5


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TimedFaultToleranceCallback(FaultToleranceCallback):
    """Times the per-step hooks: the callback's own cost, free of the machine's noise."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_hook_seconds: list[float] = []
        self._in_step = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        start = time.perf_counter()
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._in_step = time.perf_counter() - start

    def on_before_backward(self, trainer, pl_module, loss):
        start = time.perf_counter()
        super().on_before_backward(trainer, pl_module, loss)
        self._in_step += time.perf_counter() - start

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        start = time.perf_counter()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step > WARMUP_STEPS:
            self.step_hook_seconds.append(self._in_step + time.perf_counter() - start)


class Block:
    """One block of steps: with the callback or without, each step's wall time, and the CPU times spent in it."""

    def __init__(self, with_callback: bool) -> None:
        self.with_callback = with_callback
        self.steps: list[float] = []
        self.cpu = self.monitor_cpu = 0.0


class PairedModel(LightningModule):
    """Sleeps ``step_seconds`` per step. Its own ``on_train_batch_end`` runs after every callback's: from one to the
    next is a whole step, what the callback adds included; at a block's end it puts the callback in or out of
    ``trainer.callbacks`` (outside the step timed)."""

    def __init__(self, step_seconds: float, block: int, schedule: list[bool], monitor_pid: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)
        self.step_seconds, self.block, self.schedule, self.monitor_pid = step_seconds, block, schedule, monitor_pid
        self.blocks: list[Block] = []
        self._full: Optional[list[Callback]] = None
        self._last: Optional[float] = None
        self._cpu = (0.0, 0.0)

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_seconds)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self._last is not None and self.blocks:
            self.blocks[-1].steps.append(now - self._last)
        step = self.trainer.global_step
        if step >= WARMUP_STEPS and (step - WARMUP_STEPS) % self.block == 0:
            self._switch((step - WARMUP_STEPS) // self.block)
        self._last = time.perf_counter()

    def _switch(self, index: int) -> None:
        cpu = (time.process_time(), _cpu_seconds(self.monitor_pid))
        if self.blocks:
            self.blocks[-1].cpu, self.blocks[-1].monitor_cpu = cpu[0] - self._cpu[0], cpu[1] - self._cpu[1]
        callbacks = self.trainer.callbacks
        if self._full is None:
            self._full = list(callbacks)  # the callback and its DataPhaseStart are in it since on_train_start
        if index < len(self.schedule):
            with_callback = self.schedule[index]
            self.blocks.append(Block(with_callback))
            callbacks[:] = self._full if with_callback else [
                c for c in self._full if not isinstance(c, (FaultToleranceCallback, DataPhaseStart))]
        self._cpu = (time.process_time(), _cpu_seconds(self.monitor_pid))


def schedule_of(rounds: int) -> list[bool]:
    """Three blocks per round, the callback's block first, second or third in turn."""
    return [position == POSITIONS[r % len(POSITIONS)] for r in range(rounds) for position in range(3)]


def run(mode: str, rounds: int, block: int, step_seconds: float, root: str, monitor_pid: int
        ) -> tuple[list[Block], list[float]]:
    schedule = schedule_of(rounds)
    total = WARMUP_STEPS + len(schedule) * block
    # Timeouts learned at the end only: a block without the callback is a long silence to a learned one.
    ft = TimedFaultToleranceCallback(mode=mode, calculate_timeouts_after_steps=total + 1)
    data = TensorDataset(torch.randn(total * 4, 32), torch.randn(total * 4, 1))
    model = PairedModel(step_seconds, block, schedule, monitor_pid)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=total, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      default_root_dir=root, callbacks=[ft])
    trainer.fit(model, DataLoader(data, batch_size=4))
    return model.blocks, ft.step_hook_seconds


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _summary(values: list[float], seed: int = 0) -> dict[str, Any]:
    """Median, mean, p1/p99 and the bootstrap 95 % interval of the median."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    low, high = _percentile(medians, 0.025), _percentile(medians, 0.975)
    ordered = sorted(values)
    return {"median": round(statistics.median(values), 3), "mean": round(statistics.fmean(values), 3),
            "p1": round(_percentile(ordered, 0.01), 3), "p99": round(_percentile(ordered, 0.99), 3),
            "ci95_median": [round(low, 3), round(high, 3)], "ci95_halfwidth": round((high - low) / 2, 3),
            "rounds": len(values)}


def analyse(blocks: list[Block]) -> dict[str, Any]:
    """Per round: the median step of the block with the callback against the mean of the two blocks' without
    (medians: a step preempted by another process does not count), and the two without against each other."""
    overhead, floor, cpu_us, monitor_us = [], [], [], []
    for r in range(len(blocks) // 3):
        triple = blocks[3 * r:3 * r + 3]
        (on,), (a, b) = [x for x in triple if x.with_callback], [x for x in triple if not x.with_callback]
        on_step, a_step, b_step = (statistics.median(x.steps) for x in (on, a, b))
        overhead.append(100.0 * (2 * on_step / (a_step + b_step) - 1.0))
        floor.append(100.0 * (a_step / b_step - 1.0))
        cpu_us.append(1e6 * (on.cpu / len(on.steps) - (a.cpu + b.cpu) / (len(a.steps) + len(b.steps))))
        monitor_us.append(1e6 * (on.monitor_cpu / len(on.steps)
                                 - (a.monitor_cpu + b.monitor_cpu) / (len(a.steps) + len(b.steps))))
    base_step = statistics.median(step for x in blocks if not x.with_callback for step in x.steps)
    # CPU times are read in clock ticks (10 ms) for the monitor: their mean over the rounds, not a median of ticks.
    cpu = statistics.fmean(cpu_us)
    return {"overhead_pct": _summary(overhead), "floor_pct": _summary(floor),
            "cpu_us_per_step": round(cpu, 1), "cpu_overhead_pct": round(100.0 * cpu * 1e-6 / base_step, 3),
            "monitor_cpu_us_per_step": round(statistics.fmean(monitor_us), 1),
            "step_ms_without": round(1e3 * base_step, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="rounds of three blocks per mode")
    parser.add_argument("--block", type=int, default=20, help="steps per block")
    parser.add_argument("--step-ms", type=float, default=20.0, help="simulated step time")
    args = parser.parse_args()
    if args.rounds < 6 or args.block < 1:
        parser.error("--rounds must be at least 6 and --block at least 1")
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    cfg = FaultToleranceConfig(
        rank_section_timeouts={"setup": 600, "step": 600, "validation": 600, "checkpointing": 600},
        initial_rank_heartbeat_timeout=600, rank_heartbeat_timeout=600, log_level="WARNING")
    load_before = os.getloadavg()[0]
    result: dict[str, Any] = {"benchmark": "lightning_overhead", "step_ms": args.step_ms, "block_steps": args.block,
                              "rounds": args.rounds, "target_overhead_pct": TARGET_PCT}
    with tempfile.TemporaryDirectory(prefix="ft-bench-") as root:
        monitor = RankMonitorServer.run_in_subprocess(cfg, os.path.join(root, "job", "monitor.sock"))
        os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = monitor.socket_path
        try:
            for mode in MODES:
                blocks, hooks = run(mode, args.rounds, args.block, args.step_ms / 1000.0, root, monitor.pid)
                figures = analyse(blocks)
                figures["hook_us_per_step_median"] = round(1e6 * statistics.median(hooks), 1)
                figures["resolved"] = figures["overhead_pct"]["ci95_halfwidth"] < TARGET_PCT
                figures["within_target"] = figures["overhead_pct"]["ci95_median"][1] <= TARGET_PCT
                result[mode] = figures
        finally:
            monitor.stop()
    result["load_avg_1m"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    # The Measured table's header gives the load of the runs: the higher of the two.
    result["host"] = {**host(), "load_avg_1m": max(result["load_avg_1m"].values())}
    emit(result)


if __name__ == "__main__":
    main()
