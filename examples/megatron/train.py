"""A megatron-core training loop with fault tolerance hooks (CPU + gloo, or GPT on CUDA with --use-gpt).

Launch with ``ft_launcher`` (a drop-in for ``torchrun``); the monitor's section timeouts come
from its ``--ft-*`` flags, the hooks' settings from this script's ``--enable-ft`` flags::

    ft_launcher --nproc-per-node=2 --max-restarts=3 \\
        --ft-rank-section-timeouts=setup:600,step:60,eval:120,checkpointing:120 \\
        examples/megatron/train.py --enable-ft --calc-ft-timeouts \\
        --train-iters 60 --save /tmp/ckpt --load /tmp/ckpt --save-interval 10 \\
        --inject-hang-in-checkpoint-at-iter 30

The model is a tensor-parallel MLP (``ColumnParallelLinear`` -> GELU -> ``RowParallelLinear``)
fitting a fixed random linear map; checkpoints are ``megatron.core.dist_checkpointing``
sharded checkpoints in ``<save>/iter_NNNNNNN`` with Megatron's
``latest_checkpointed_iteration.txt`` tracker. The optimizer is plain SGD (no state), so the
model's sharded state dict is the whole training state. Faults are injected only in the first
launcher cycle (``TORCHELASTIC_RESTART_COUNT=0``), so the restarted job can finish, except
``--inject-value-error-at-iter`` (a deterministic bug: every cycle).

A resume loads the newest good checkpoint (``ft.load_checkpoint_verified``): the tracker's
``iter_N`` first, then older ones, each checked (its manifest, written by the hooks after the
save; not marked bad by the launcher), loaded and its weights checked for NaN, the same on
every rank; the loss of the first steps after it is watched (``ft.on_training_step_end(loss=...)``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.module import MegatronModule

from ft_core.utils.fileutil import atomic_write_text
from ft_integrations import megatron as ft

TRACKER_FILE = "latest_checkpointed_iteration.txt"


def parse_args(parser: Optional[argparse.ArgumentParser] = None) -> argparse.Namespace:
    """This example's arguments (added to ``parser``, e.g. a script's own, when given)."""
    parser = parser or argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-iters", type=int, default=60)
    parser.add_argument("--save", default=None, help="checkpoint directory to write")
    parser.add_argument("--load", default=None, help="checkpoint directory to resume from")
    parser.add_argument("--save-interval", type=int, default=0, help="save every N iterations (0: only at the end)")
    parser.add_argument("--eval-interval", type=int, default=0, help="evaluate every N iterations (0: never)")
    parser.add_argument("--eval-iters", type=int, default=2)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=None,
                        help="default: the world size (all ranks form one tensor-parallel group)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="extra seconds of simulated compute per train/eval step (steadier timings on busy machines)")
    parser.add_argument("--use-gpt", action="store_true", help="train megatron-core's GPTModel (needs CUDA)")
    faults = parser.add_argument_group("fault injection (first launcher cycle only)")
    faults.add_argument("--inject-hang-in-checkpoint-at-iter", type=int, default=None, metavar="N",
                        help="hang inside the checkpoint save of iteration N")
    faults.add_argument("--inject-hang-in-step-at-iter", type=int, default=None, metavar="N",
                        help="hang inside training step N")
    faults.add_argument("--inject-crash-at-iter", type=int, default=None, metavar="N",
                        help="raise an exception in training step N")
    faults.add_argument("--inject-value-error-at-iter", type=int, default=None, metavar="N",
                        help="raise ValueError in training step N in every cycle (a deterministic fault)")
    faults.add_argument("--inject-nan-weights-at-iter", type=int, default=None, metavar="N",
                        help="the checkpoint of iteration N holds NaN weights (every rank's shard)")
    faults.add_argument("--inject-huge-weights-at-iter", type=int, default=None, metavar="N",
                        help="the checkpoint of iteration N holds weights x 1e30: finite, but the loss is not")
    faults.add_argument("--inject-truncate-checkpoint-at-iter", type=int, default=None, metavar="N",
                        help="once the checkpoint of iteration N is complete, cut its largest file in half")
    faults.add_argument("--inject-rank", type=int, default=0, help="the rank that misbehaves")
    ft.add_ft_args(parser)
    return parser.parse_args()


# -- faults ----------------------------------------------------------------
def _injecting(args: argparse.Namespace, at_iter: int | None, iteration: int, every_cycle: bool = False) -> bool:
    return (at_iter == iteration and dist.get_rank() == args.inject_rank
            and (every_cycle or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0))


def truncate_checkpoint(checkpoint_dir: str, timeout: float = 60.0) -> None:
    """Cut the largest file of a complete checkpoint in half, once its manifest lists it (a torn file on storage)."""
    from ft_core.checkpoint_manifest import DIR_MANIFEST
    from ft_core.utils.deadline import wait_until

    # The hooks write the manifest in a background thread after the save: damage what it lists.
    if not wait_until(lambda: os.path.exists(os.path.join(checkpoint_dir, DIR_MANIFEST)), timeout):
        raise RuntimeError(f"no manifest in {checkpoint_dir} after {timeout} s")
    files = [os.path.join(checkpoint_dir, name) for name in os.listdir(checkpoint_dir) if name != DIR_MANIFEST]
    largest = max(files, key=os.path.getsize)
    os.truncate(largest, os.path.getsize(largest) // 2)
    print(f"[rank {dist.get_rank()}] injected truncation of {largest}", flush=True)


def hang_forever(where: str, iteration: int) -> None:
    print(f"[rank {dist.get_rank()}] injected hang in {where} at iteration {iteration}", flush=True)
    while True:  # like a stuck storage write or collective: alive, but no progress
        time.sleep(1.0)


# -- model -----------------------------------------------------------------
class ParallelMLP(MegatronModule):
    """Tensor-parallel MLP: the hidden layer is split column-wise, the output layer row-wise."""

    def __init__(self, config: ModelParallelConfig, hidden: int) -> None:
        super().__init__(config=config)
        init = torch.nn.init.xavier_normal_
        self.fc1 = ColumnParallelLinear(hidden, 4 * hidden, config=config, init_method=init, bias=True,
                                        gather_output=False)
        self.fc2 = RowParallelLinear(4 * hidden, hidden, config=config, init_method=init, bias=True,
                                     input_is_parallel=True, skip_bias_add=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.fc1(x)
        out, _ = self.fc2(torch.nn.functional.gelu(hidden))
        return out


class MLPTask:
    """Regression onto a fixed random linear map; batch i is the same on every run (resumable)."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        config = ModelParallelConfig(tensor_model_parallel_size=args.tensor_model_parallel_size,
                                     use_cpu_initialization=True, params_dtype=torch.float32)
        torch.manual_seed(args.seed)  # identical init on every rank before sharding
        self.model = ParallelMLP(config, args.hidden_size).to(device)
        generator = torch.Generator().manual_seed(args.seed)
        self.target = torch.randn(args.hidden_size, args.hidden_size, generator=generator) / args.hidden_size**0.5
        self.args, self.device = args, device

    def loss(self, iteration: int, split: int = 0) -> torch.Tensor:
        # Tensor-parallel ranks must see the same batch; data-parallel ranks different ones.
        dp_rank = parallel_state.get_data_parallel_rank()
        seed = self.args.seed + 1_000_003 * split + 7919 * iteration + dp_rank
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(self.args.micro_batch_size, self.args.hidden_size, generator=generator)
        y = x @ self.target
        return torch.nn.functional.mse_loss(self.model(x.to(self.device)), y.to(self.device))


class GPTTask:
    """megatron-core's GPTModel on random tokens (CUDA only: its attention needs it)."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.transformer_config import TransformerConfig

        model_parallel_cuda_manual_seed(args.seed)
        config = TransformerConfig(num_layers=2, hidden_size=args.hidden_size, num_attention_heads=4,
                                   tensor_model_parallel_size=args.tensor_model_parallel_size,
                                   use_cpu_initialization=True, params_dtype=torch.float32)
        self.seq_len, self.vocab = 64, 256
        self.model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=self.vocab,
                              max_sequence_length=self.seq_len).to(device)
        self.args, self.device = args, device

    def loss(self, iteration: int, split: int = 0) -> torch.Tensor:
        seed = self.args.seed + 1_000_003 * split + 7919 * iteration + parallel_state.get_data_parallel_rank()
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, self.vocab, (self.args.micro_batch_size, self.seq_len + 1), generator=generator)
        tokens = tokens.to(self.device)
        position_ids = torch.arange(self.seq_len, device=self.device).expand(self.args.micro_batch_size, -1)
        causal = torch.ones(1, 1, self.seq_len, self.seq_len, device=self.device).tril() < 0.5
        return self.model(tokens[:, :-1], position_ids, causal, labels=tokens[:, 1:]).float().mean()


# -- checkpoints -------------------------------------------------------------
def cpu_save_strategy() -> Any:
    """The ``torch_dist`` format written synchronously with ``torch.distributed.checkpoint``.

    megatron-core 0.16's own torch_dist writer calls ``torch.cuda.synchronize()``; this writes
    the same files (read back by the default loader) without touching CUDA.
    """
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner,
        TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )

    class CpuTorchDistSaveStrategy(TorchDistSaveShardedStrategy):
        def save(self, sharded_state_dict: dict[str, Any], checkpoint_dir: Any) -> None:
            sharded_state_dict, _, _ = _replace_state_dict_keys_with_sharded_keys(
                sharded_state_dict, self.keep_only_main_replica)
            dcp.save(mcore_to_pyt_state_dict(sharded_state_dict, False),
                     storage_writer=dcp.FileSystemWriter(str(checkpoint_dir)),
                     planner=MCoreSavePlanner(dedup_replicated_tensors=not self.keep_only_main_replica,
                                              flatten_state_dict=False))

    return CpuTorchDistSaveStrategy("torch_dist", 1)


def write_checkpoint(args: argparse.Namespace, model: MegatronModule, iteration: int, strategy: Any,
                     tracker: bool = True, **extra: Any) -> None:
    """Write ``<save>/iter_NNNNNNN`` (the model's shards, ``iteration`` and ``extra``), then point the tracker at it
    (unless ``tracker=False``: an async save points it at its finalization, see :func:`write_tracker`)."""
    checkpoint_dir = os.path.join(args.save, f"iter_{iteration:07d}")
    if dist.get_rank() == 0:
        os.makedirs(checkpoint_dir, exist_ok=True)
    dist.barrier()
    state = model.sharded_state_dict()
    state["iteration"] = iteration
    state.update(extra)
    dist_checkpointing.save(state, checkpoint_dir, sharded_strategy=strategy)
    if tracker:
        write_tracker(args, iteration)


def write_tracker(args: argparse.Namespace, iteration: int) -> None:
    """Point the tracker at ``iteration``'s checkpoint once every rank's shards are written."""
    dist.barrier()  # every shard is written before the tracker points at it
    if dist.get_rank() == 0:
        atomic_write_text(os.path.join(args.save, TRACKER_FILE), f"{iteration}\n")
        print(f"saved checkpoint at iteration {iteration}", flush=True)


def read_checkpoint(args: argparse.Namespace, model: MegatronModule,
                    iteration: Optional[int] = None) -> tuple[int, dict[str, Any]]:
    """Load ``iteration``'s checkpoint (default: the tracker's) into ``model``: ``(iteration, the other saved
    entries)``; ``(0, {})`` if none."""
    tracker = os.path.join(args.load, TRACKER_FILE) if args.load else None
    if iteration is None:
        if tracker is None or not os.path.exists(tracker):
            return 0, {}
        with open(tracker, encoding="utf-8") as handle:
            iteration = int(handle.read().strip())
    state = dist_checkpointing.load(model.sharded_state_dict(), os.path.join(args.load, f"iter_{iteration:07d}"))
    return iteration, apply_checkpoint(model, state, iteration)


def apply_checkpoint(model: MegatronModule, state: dict[str, Any], iteration: int) -> dict[str, Any]:
    """Load a loaded checkpoint's weights into ``model``; returns its other saved entries."""
    assert state.pop("iteration") == iteration
    extra = {key: state.pop(key) for key in list(state) if key not in model.state_dict()}
    model.load_state_dict(state)
    if dist.get_rank() == 0:
        print(f"resumed from iteration {iteration}", flush=True)
    return extra


def save_checkpoint(args: argparse.Namespace, model: MegatronModule, iteration: int, strategy: Any) -> None:
    ft.on_checkpointing_start()
    if _injecting(args, args.inject_hang_in_checkpoint_at_iter, iteration):
        hang_forever("checkpoint save", iteration)
    # Learned timeouts travel with the checkpoint.
    corruption = None
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        corruption = {args.inject_nan_weights_at_iter: "nan", args.inject_huge_weights_at_iter: "huge"}.get(iteration)
    # Every rank's shard (NVRx issue 349's replicated NaN shards).
    with corrupted_weights(model, CORRUPTIONS.get(corruption or "")):
        write_checkpoint(args, model, iteration, strategy, ft_state=ft.state_dict())
    ft.on_checkpointing_end(is_async_finalization=False, iteration=iteration)
    if _injecting(args, args.inject_truncate_checkpoint_at_iter, iteration):
        truncate_checkpoint(os.path.join(args.save, f"iter_{iteration:07d}"))


#: Injected checkpoint corruptions, applied in place to every parameter: NaN weights (the load's finite
#: check rejects them), or weights x 1e30 (finite, so they load, but the loss is infinite at once).
CORRUPTIONS: dict[str, Callable[[torch.Tensor], Any]] = {
    "nan": lambda param: param.fill_(float("nan")),
    "huge": lambda param: param.mul_(1e30),
}


@contextlib.contextmanager
def corrupted_weights(model: MegatronModule, corrupt: Optional[Callable[[torch.Tensor], Any]]) -> Iterator[None]:
    """Inside the block, ``corrupt`` (in place) was applied to every parameter of the model; restored after."""
    if corrupt is None:
        yield
        return
    saved = [param.detach().clone() for param in model.parameters()]
    with torch.no_grad():
        for param in model.parameters():
            corrupt(param)
    try:
        yield
    finally:
        with torch.no_grad():
            for param, value in zip(model.parameters(), saved):
                param.copy_(value)


def load_checkpoint(args: argparse.Namespace, model: MegatronModule) -> int:
    """Resume from the newest good checkpoint; returns the iteration to continue from (0: fresh start)."""
    names = set(model.state_dict())
    result = ft.load_checkpoint_verified(
        args.load, lambda path: dist_checkpointing.load(model.sharded_state_dict(), path),
        weights=lambda state: {key: value for key, value in state.items() if key in names})
    if result is None:
        return 0
    iteration = int(result.state["iteration"])
    extra = apply_checkpoint(model, result.state, iteration)
    ft.load_state_dict(extra.get("ft_state"))
    ft.on_checkpoint_loaded(is_local_chkpt=False)
    return iteration


# -- training ----------------------------------------------------------------
def evaluate(args: argparse.Namespace, task: Any, iteration: int) -> float:
    total = 0.0
    with torch.no_grad():
        for i in range(args.eval_iters):
            ft.on_eval_step_start()
            total += task.loss(iteration * args.eval_iters + i, split=1).item()
            if args.step_time:
                time.sleep(args.step_time)
            ft.on_eval_step_end()
    return total / args.eval_iters


def train(args: argparse.Namespace) -> None:
    cuda = torch.cuda.is_available()
    if args.use_gpt and not cuda:
        raise SystemExit("--use-gpt needs CUDA: megatron-core's GPT attention does not run on CPU")
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.tensor_model_parallel_size is None:
        args.tensor_model_parallel_size = dist.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=args.tensor_model_parallel_size)
    try:
        task = GPTTask(args, device) if args.use_gpt else MLPTask(args, device)
        strategy = None if cuda else cpu_save_strategy()  # None: megatron-core's default writer
        iteration = last_saved = load_checkpoint(args, task.model)
        optimizer = torch.optim.SGD(task.model.parameters(), lr=args.lr)
        dp_group, dp_size = parallel_state.get_data_parallel_group(), parallel_state.get_data_parallel_world_size()
        while iteration < args.train_iters:
            ft.on_training_step_start(iteration)
            if _injecting(args, args.inject_hang_in_step_at_iter, iteration):
                hang_forever("training step", iteration)
            if _injecting(args, args.inject_crash_at_iter, iteration):
                raise RuntimeError(f"injected crash at iteration {iteration}")
            if _injecting(args, args.inject_value_error_at_iter, iteration, every_cycle=True):
                raise ValueError(f"injected deterministic fault at iteration {iteration}")
            optimizer.zero_grad(set_to_none=True)
            loss = task.loss(iteration)
            loss.backward()
            if dp_size > 1:
                for param in task.model.parameters():
                    dist.all_reduce(param.grad, group=dp_group)
                    param.grad /= dp_size
            optimizer.step()
            if args.step_time:
                time.sleep(args.step_time)
            ft.on_training_step_end(loss=loss)  # NaN right after a resume: the checkpoint is bad
            iteration += 1
            if dist.get_rank() == 0 and args.log_interval and iteration % args.log_interval == 0:
                print(f"iteration {iteration}/{args.train_iters} loss {loss.item():.5f}", flush=True)
            if args.eval_interval and iteration % args.eval_interval == 0:
                eval_loss = evaluate(args, task, iteration)
                if dist.get_rank() == 0:
                    print(f"iteration {iteration} eval loss {eval_loss:.5f}", flush=True)
            if args.save and args.save_interval and iteration % args.save_interval == 0:
                save_checkpoint(args, task.model, iteration, strategy)
                last_saved = iteration
        if args.save and last_saved != iteration:
            save_checkpoint(args, task.model, iteration, strategy)
    finally:
        parallel_state.destroy_model_parallel()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK', 0)}] %(name)s: %(message)s")
    ft.setup(args)  # before anything that can hang: process group and model init are in "setup"
    try:
        train(args)
    except BaseException:
        ft.abort()  # leave the monitor without collectives; the launcher restarts the workers
        raise
    ft.shutdown(training_finished=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
