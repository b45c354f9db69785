"""The training script of ``goodput.py``: one rank of a small gloo job with paced steps, run unchanged by both launchers.

Every step computes a small MLP's gradients, all-reduces them (one gloo all-reduce that also
carries rank 0's "stop" flag, so every rank stops after the same step) and sleeps until the
step has lasted ``GOODPUT_STEP_S``. Rank 0 writes a disk checkpoint every ``GOODPUT_CKPT_EVERY``
steps (the others wait in a barrier), as ``examples/ddp_train.py`` does. Under ``ft_launcher``
the script also does what that launcher's documentation asks of a plain loop: a heartbeat per
step, the heartbeat timeouts learned 20 steps after each start and at each checkpoint (kept in the checkpoint and the
snapshot), and in-memory snapshots at the automatic interval (``NodeSnapshots.for_rank``,
``every="auto"``: the default), resumed from when newer than the disk checkpoint. Under
torchrun there is no monitor and no snapshot: only the disk checkpoint.

Faults come from the benchmark through ``$GOODPUT_DIR/fault.json`` (``{"id", "kind", "rank"}``):
the named rank claims it by renaming the file, then raises (``crash``) or stops before the
all-reduce forever (``hang``: its peers block inside the collective). The process group's
timeout (the collective's own) is ``GOODPUT_COLLECTIVE_TIMEOUT`` seconds.

Appends JSON lines to ``$GOODPUT_DIR/records.jsonl``: ``started`` and ``resumed`` (every rank),
``step`` and ``checkpoint`` (rank 0), ``fault`` (the rank that took it), ``stopped`` (rank 0).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

DIR = os.environ["GOODPUT_DIR"]
STEP_S = float(os.environ["GOODPUT_STEP_S"])
CKPT_EVERY = int(os.environ["GOODPUT_CKPT_EVERY"])
COLLECTIVE_TIMEOUT = float(os.environ["GOODPUT_COLLECTIVE_TIMEOUT"])
FAULT, STOP, CKPT = (os.path.join(DIR, name) for name in ("fault.json", "stop", "ckpt"))
#: Steps after each start at which the heartbeat timeout is learned (as ``examples/ddp_train.py``'s ``--learn-after``).
LEARN_AFTER = 20
CYCLE = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
_records = open(os.path.join(DIR, "records.jsonl"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115


def record(rank: int, **fields: Any) -> None:
    """One line, one ``write`` (O_APPEND): the ranks of every node share the file."""
    _records.write(json.dumps({"t": time.time(), "pid": os.getpid(), "rank": rank, "cycle": CYCLE, **fields}) + "\n")


def latest_checkpoint() -> Optional[str]:
    try:
        with open(os.path.join(CKPT, "latest"), encoding="utf-8") as handle:
            return os.path.join(CKPT, handle.read().strip())
    except FileNotFoundError:
        return None


def save_checkpoint(step: int, state: dict[str, Any]) -> None:
    """``step_<N>.pt`` then the ``latest`` pointer, each by rename; the one before is removed after."""
    os.makedirs(CKPT, exist_ok=True)
    previous = latest_checkpoint()
    name = f"step_{step:07d}.pt"
    torch.save(state, os.path.join(CKPT, name + ".tmp"))
    os.replace(os.path.join(CKPT, name + ".tmp"), os.path.join(CKPT, name))
    with open(os.path.join(CKPT, "latest.tmp"), "w", encoding="utf-8") as handle:
        handle.write(name)
    os.replace(os.path.join(CKPT, "latest.tmp"), os.path.join(CKPT, "latest"))
    if previous is not None and os.path.basename(previous) != name:
        try:
            os.remove(previous)
        except FileNotFoundError:
            pass


def take_fault(rank: int, step: int) -> None:
    """Claim and apply the pending fault if it names this rank (the rename makes the claim once only)."""
    try:
        with open(FAULT, encoding="utf-8") as handle:
            fault = json.load(handle)
    except (FileNotFoundError, ValueError):
        return
    if fault["rank"] != rank:
        return
    try:
        os.rename(FAULT, f"{FAULT}.{fault['id']}")
    except FileNotFoundError:
        return
    record(rank, event="fault", id=fault["id"], kind=fault["kind"], step=step - 1)
    _records.flush()
    if fault["kind"] == "crash":
        raise RuntimeError(f"goodput benchmark: injected crash (fault {fault['id']})")
    while True:  # hang: never reach the all-reduce; the peers wait in it
        time.sleep(3600)


def main() -> None:
    client: Any = None
    if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):  # under ft_launcher
        from ft_core.client import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
    clock = [time.monotonic()]  # the start's phases: process group, model, disk checkpoint, snapshot
    dist.init_process_group("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
    rank, world = dist.get_rank(), dist.get_world_size()
    record(rank, event="started", world=world)
    clock.append(time.monotonic())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())
    clock.append(time.monotonic())

    step, ft_state, source = 0, {}, "fresh"
    path = latest_checkpoint()
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, ft_state, source = state["step"], state["ft_state"], "disk"
    clock.append(time.monotonic())
    snapshots = None
    if client is not None:
        from ft_core.snapshots.node import NodeSnapshots

        snapshots = NodeSnapshots.for_rank(rank, world)  # every="auto": the default
        if snapshots is not None:
            snap = snapshots.resume(step if path is not None else None)
            if snap is not None:
                model.load_state_dict(snap["model"])
                optimizer.load_state_dict(snap["optimizer"])
                step, ft_state, source = snap["step"], snap["ft_state"], "snapshot"
        if ft_state:
            client.load_state_dict(ft_state)  # the timeouts learned before the fault
    clock.append(time.monotonic())
    record(rank, event="resumed", step=step, source=source,
           phases_s=[round(b - a, 3) for a, b in zip(clock, clock[1:])])

    def full_state() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "ft_state": client.state_dict() if client is not None else {}}

    generator = torch.Generator().manual_seed(rank)
    learn_at = step + LEARN_AFTER
    while True:
        begun = time.monotonic()
        step += 1
        take_fault(rank, step)
        loss = model(torch.randn(32, 64, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        stop = float(rank == 0 and os.path.exists(STOP))
        flat = torch.cat([*(p.grad.reshape(-1) for p in params), torch.tensor([stop])])  # type: ignore[union-attr]
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p) / world)  # type: ignore[union-attr]
            offset += p.numel()
        optimizer.step()
        stopping = bool(flat[-1] > 0)
        if client is not None:
            client.send_heartbeat()
        if client is not None and (step == learn_at or step % CKPT_EVERY == 0):
            # A collective, at the same step on every rank: after a few steps of each start, then at each save
            # (before the snapshot and the checkpoint, which keep the values).
            client.calculate_and_set_hb_timeouts(skip_if_not_ready=True)
        if snapshots is not None:
            snapshots.maybe_save(step, full_state)
        if step % CKPT_EVERY == 0 or stopping:
            if rank == 0:
                save_checkpoint(step, full_state())
                record(rank, event="checkpoint", step=step)
            dist.barrier()
            if client is not None:
                client.report_checkpoint(step)
        if rank == 0:
            record(rank, event="step", step=step)
        if stopping:
            break
        time.sleep(max(0.0, begun + STEP_S - time.monotonic()))
    if rank == 0:
        record(rank, event="stopped", step=step)
    if snapshots is not None:
        snapshots.close()
    if client is not None:
        client.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
