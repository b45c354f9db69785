"""A training script shaped like Megatron-LM's pretrain()/train()/evaluate()/save_checkpoint().

It calls ``ft_integrations.megatron.ft_integration`` exactly where Megatron-LM calls its own
``megatron.training.ft_integration`` (the one-line import switch of the migration guide),
on megatron-core (tensor-parallel MLP, CPU/gloo). The model, data and checkpoint format are
``examples/megatron/train.py``'s; only the loop and the FT call sites are Megatron-LM's.
Only megatron-core is installed, so :func:`megatron_training_stand_in` provides the two pieces
of Megatron-LM's ``megatron.training`` that FT reads, in Megatron-LM's order: the global args
are still unset when ``ft_integration.setup()`` runs and set by ``initialize_megatron()`` after.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import types
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "megatron"))
from train import (  # noqa: E402
    CORRUPTIONS,
    MLPTask,
    _injecting,
    corrupted_weights,
    cpu_save_strategy,
    hang_forever,
    read_checkpoint,
    write_checkpoint,
    write_tracker,
)
from train import parse_args as _example_args  # noqa: E402

if os.environ.get("PRETRAIN_FT_INTEGRATION") == "nvrx-client":
    # Megatron-LM's own module, which imports nvidia_resiliency_ext (ft_integrations.nvrx_alias serves it).
    sys.path.insert(0, os.path.dirname(__file__))
    import nvrx_client_integration as ft_integration  # noqa: E402
else:
    from ft_integrations.megatron import ft_integration  # noqa: E402


def example_args() -> argparse.Namespace:
    """The example's arguments plus Megatron-LM's ``--async-save`` (and a stand-in for its storage)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--async-save", action="store_true",
                        help="save in the background; the tracker points at a save once it is finalized")
    parser.add_argument("--async-write-time", type=float, default=0.0,
                        help="seconds the background write of an async save takes (the slow storage)")
    parser.add_argument("--setup-time", type=float, default=0.0,
                        help="seconds of extra start-up (a cold cache, a slow filesystem) inside setup")
    return _example_args(parser)


class AsyncSaves:
    """Megatron-LM's async checkpointing, reduced: ``save_checkpoint`` schedules the slow part of a save in
    the background and returns; ``maybe_finalize_async_save`` (training.py, every iteration and blocking at
    the end) finalizes it once every rank's write is done, inside ``on_checkpointing_start`` /
    ``on_checkpointing_end(is_async_finalization=True)``, and only then points the tracker at it. Here the
    shards are written at once (their collectives cannot run beside training's) and the background write
    stands for the flush to slow storage that Megatron-LM's async worker does."""

    def __init__(self) -> None:
        self.pending: tuple[int, threading.Thread] | None = None

    def schedule(self, args: argparse.Namespace, iteration: int) -> None:
        writer = threading.Thread(target=time.sleep, args=(args.async_write_time,), daemon=True)
        writer.start()
        self.pending = (iteration, writer)

    def maybe_finalize(self, args: argparse.Namespace, blocking: bool) -> None:
        if self.pending is None:
            return
        iteration, writer = self.pending
        # Every rank finalizes the same save at the same iteration: finalize once all are done.
        done = torch.tensor([0 if writer.is_alive() else 1])
        if not blocking:
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            if not done.item():
                return
        ft_integration.on_checkpointing_start()
        writer.join()
        write_tracker(args, iteration)
        self.pending = None
        ft_integration.on_checkpointing_end(is_async_finalization=True)


ASYNC_SAVES = AsyncSaves()


def megatron_training_stand_in() -> types.ModuleType:
    """``megatron.training.global_vars`` (``_GLOBAL_ARGS`` unset) and ``.arguments`` (``parse_args``), as
    Megatron-LM's training.py has them imported before ``pretrain()``; returns ``global_vars``."""
    global_vars = types.ModuleType("megatron.training.global_vars")
    global_vars._GLOBAL_ARGS = None  # type: ignore[attr-defined]
    arguments = types.ModuleType("megatron.training.arguments")
    arguments.parse_args = lambda ignore_unknown_args=False: example_args()  # type: ignore[attr-defined]
    training = types.ModuleType("megatron.training")
    training.global_vars, training.arguments = global_vars, arguments  # type: ignore[attr-defined]
    sys.modules.update({"megatron.training": training, "megatron.training.global_vars": global_vars,
                        "megatron.training.arguments": arguments})
    return global_vars


def save_checkpoint(args: argparse.Namespace, model: Any, iteration: int, strategy: Any) -> None:
    # megatron/training/checkpointing.py: save_checkpoint()
    ASYNC_SAVES.maybe_finalize(args, blocking=True)  # one async save in flight at a time
    ft_integration.on_checkpointing_start()
    first_cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    corrupt = CORRUPTIONS["nan"] if first_cycle and iteration == args.inject_nan_weights_at_iter else None
    with corrupted_weights(model, corrupt):  # every rank's shard
        write_checkpoint(args, model, iteration, strategy, tracker=not args.async_save)
    if args.async_save:
        ASYNC_SAVES.schedule(args, iteration)
    ft_integration.on_checkpointing_end(is_async_finalization=False)


def load_checkpoint(args: argparse.Namespace, model: Any) -> int:
    # megatron/training/checkpointing.py: load_checkpoint() loads args.ckpt_step when set, else the tracker's
    iteration, _ = read_checkpoint(args, model, getattr(args, "ckpt_step", None))
    if iteration:
        ft_integration.on_checkpoint_loaded(is_local_chkpt=False)
    return iteration


def evaluate(args: argparse.Namespace, task: MLPTask, iteration: int) -> float:
    # megatron/training/training.py: evaluate()
    total = 0.0
    with torch.no_grad():
        for i in range(args.eval_iters):
            ft_integration.on_eval_step_start()
            total += task.loss(iteration * args.eval_iters + i, split=1).item()
            time.sleep(args.step_time)
            ft_integration.on_eval_step_end()
    return total / args.eval_iters


def train(args: argparse.Namespace, task: MLPTask, iteration: int, strategy: Any) -> int:
    # megatron/training/training.py: train()
    optimizer = torch.optim.SGD(task.model.parameters(), lr=args.lr)
    while iteration < args.train_iters:
        ASYNC_SAVES.maybe_finalize(args, blocking=False)  # training.py: maybe_finalize_async_save()
        args.curr_iteration = iteration
        ft_integration.on_training_step_start()
        if _injecting(args, args.inject_hang_in_step_at_iter, iteration):
            hang_forever("training step", iteration)
        if _injecting(args, args.inject_crash_at_iter, iteration):
            raise RuntimeError(f"injected crash at iteration {iteration}")
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(iteration)
        if torch.isnan(loss):  # Megatron-LM's --check-for-nan-in-loss-and-grad (on by default): every rank alike
            raise RuntimeError("found NaN in local forward loss calculation")
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        ft_integration.on_training_step_end()
        iteration += 1
        if dist.get_rank() == 0 and args.log_interval and iteration % args.log_interval == 0:
            print(f" iteration {iteration}/{args.train_iters}", flush=True)  # training.py: training_log()
        if args.eval_interval and iteration % args.eval_interval == 0:
            evaluate(args, task, iteration)
        if args.save_interval and iteration % args.save_interval == 0:
            save_checkpoint(args, task.model, iteration, strategy)
    return iteration


def pretrain() -> None:
    # megatron/training/training.py: pretrain()
    global_vars = megatron_training_stand_in()
    ft_integration.setup()  # no argument, as Megatron-LM: the global args are not set yet
    args = example_args()
    time.sleep(args.setup_time)
    dist.init_process_group("gloo")  # initialize_megatron(): it sets the global args
    global_vars._GLOBAL_ARGS = args  # type: ignore[attr-defined]
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=dist.get_world_size())
    ft_integration.maybe_setup_simulated_fault()
    try:
        task = MLPTask(args, torch.device("cpu"))
        strategy = cpu_save_strategy()
        if hasattr(ft_integration, "choose_checkpoint_iteration"):  # ours (Megatron-LM's module has none)
            args.ckpt_step = ft_integration.choose_checkpoint_iteration()  # the one line added to Megatron-LM
        iteration = load_checkpoint(args, task.model)
        iteration = train(args, task, iteration, strategy)
        if iteration % args.save_interval:
            save_checkpoint(args, task.model, iteration, strategy)
        ASYNC_SAVES.maybe_finalize(args, blocking=True)
    finally:
        parallel_state.destroy_model_parallel()
    ft_integration.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK', 0)}] %(name)s: %(message)s")
    pretrain()
