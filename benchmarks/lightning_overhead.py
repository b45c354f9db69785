"""Overhead of FaultToleranceCallback on a Lightning training step (prints JSON).

The same small model, whose training step takes ~20 ms (a sleep stands in for
compute, so the machine's load does not swamp the difference), is trained
without the callback and with it in both modes, in one process, in
interleaved rounds, against a real rank monitor started with
``RankMonitorServer.run_in_subprocess``. Throughput is measured between the
end of a warm-up step and the end of the last step, so setup is excluded. On a
busy machine the wall-clock comparison is noisy; ``overhead_pct_spread`` gives
the per-round overheads (median, min, max over the rounds) and
``hook_us_per_step`` (time spent inside the callback's per-step hooks) is the
callback's own cost.

    python benchmarks/lightning_overhead.py [--steps 150] [--rounds 5] [--step-ms 20]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.monitor import RankMonitorServer  # noqa: E402
from ft_integrations.lightning import FaultToleranceCallback  # noqa: E402

WARMUP_STEPS = 10
VARIANTS = ("baseline", "heartbeats", "sections")


class SleepyModel(LightningModule):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)
        self.step_seconds = step_seconds

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_seconds)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepClock(Callback):
    """Time from the end of the warm-up to the end of the last step."""

    def __init__(self) -> None:
        self.start = self.end = 0.0
        self.steps = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if trainer.global_step == WARMUP_STEPS:
            self.start = now
        elif trainer.global_step > WARMUP_STEPS:
            self.end, self.steps = now, trainer.global_step - WARMUP_STEPS


class TimedFaultToleranceCallback(FaultToleranceCallback):
    """Times the per-step hooks: the callback's own cost, free of the machine's noise."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step_hook_seconds: list[float] = []
        self._start_hook = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        start = time.perf_counter()
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._start_hook = time.perf_counter() - start

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        start = time.perf_counter()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step > WARMUP_STEPS:
            self.step_hook_seconds.append(self._start_hook + time.perf_counter() - start)


def run(variant: str, steps: int, step_seconds: float, root: str, hook_us: dict[str, list[float]]) -> float:
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    ft = None
    if variant != "baseline":
        ft = TimedFaultToleranceCallback(mode=variant, calculate_timeouts_after_steps=WARMUP_STEPS // 2)
        callbacks.insert(0, ft)
    data = TensorDataset(torch.randn(steps * 4, 32), torch.randn(steps * 4, 1))
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=steps + WARMUP_STEPS, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, default_root_dir=root, callbacks=callbacks)
    trainer.fit(SleepyModel(step_seconds), DataLoader(data, batch_size=4))
    if ft is not None:
        hook_us[variant].extend(1e6 * t for t in ft.step_hook_seconds)
    return clock.steps / (clock.end - clock.start)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "rounds": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each runs every variant)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="simulated step time")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    cfg = FaultToleranceConfig(
        rank_section_timeouts={"setup": 600, "step": 600, "validation": 600, "checkpointing": 600},
        initial_rank_heartbeat_timeout=600, rank_heartbeat_timeout=600, log_level="WARNING")
    with tempfile.TemporaryDirectory(prefix="ft-bench-") as root:
        monitor = RankMonitorServer.run_in_subprocess(cfg, os.path.join(root, "job", "monitor.sock"))
        os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = monitor.socket_path
        try:
            rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
            hook_us: dict[str, list[float]] = {v: [] for v in VARIANTS[1:]}
            for round_index in range(args.rounds):
                # Rotate the order so no variant always runs first (or last) in a round.
                order = VARIANTS[round_index % 3:] + VARIANTS[:round_index % 3]
                for variant in order:
                    rates[variant].append(run(variant, args.steps, args.step_ms / 1000.0, root, hook_us))
        finally:
            monitor.stop()
    baseline = statistics.median(rates["baseline"])
    result = {
        "benchmark": "lightning_overhead",
        "step_ms": args.step_ms,
        "timed_steps_per_run": args.steps,
        "rounds": args.rounds,
        "steps_per_s": {v: round(statistics.median(r), 3) for v, r in rates.items()},
        # Wall-clock comparison: includes the machine's noise (other processes, sleep jitter).
        "overhead_pct": {v: round(100.0 * (baseline / statistics.median(rates[v]) - 1.0), 3)
                         for v in VARIANTS[1:]},
        # Time inside the callback's per-step hooks (median and mean over all timed steps; the
        # mean includes preemptions by other processes), relative to the baseline step time.
        "hook_us_per_step_median": {v: round(statistics.median(h), 1) for v, h in hook_us.items()},
        "hook_us_per_step_mean": {v: round(statistics.fmean(h), 1) for v, h in hook_us.items()},
        "hook_overhead_pct": {v: round(100.0 * statistics.median(h) * 1e-6 * baseline, 4)
                              for v, h in hook_us.items()},
        # Per round: the variant against the baseline of the same round (machine drift hits both).
        "overhead_pct_spread": {v: _spread([100.0 * (b / r - 1.0) for b, r in zip(rates["baseline"], rates[v])])
                                for v in VARIANTS[1:]},
        "runs_steps_per_s": {v: [round(x, 3) for x in r] for v, r in rates.items()},
        "load_avg_1m": os.getloadavg()[0],
        "target_overhead_pct": 0.5,
    }
    emit(result)


if __name__ == "__main__":
    main()
