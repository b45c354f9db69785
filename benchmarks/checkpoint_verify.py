"""What verifying a checkpoint before a resume costs, beside what loading it costs (the floor), in one run.

    python benchmarks/checkpoint_verify.py [--gb 1.0] [--repeats 5]

Writes a checkpoint of ``--gb`` GB of float32 weights with the Lightning callback's save path
(``save_file_atomically`` around ``torch.save``), then times, interleaved ``--repeats`` times:
``load`` (``torch.load``: what a resume pays anyway), ``manifest`` (size and CRC-32 of the file,
:func:`ft_core.checkpoint_manifest.verify`) and ``finite`` (``torch.isfinite`` over every tensor of
the loaded state); ``manifest_and_finite`` is the two together, per repeat (what a resume with
the default checks adds to its load). The page cache is warm for all of them (the file was just
written or read): a cold read from shared storage costs every one of them the same read. Prints
JSON: seconds (median, p99, min, max) of each, per GB, and the verification's share of the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import emit, summarize  # noqa: E402

from ft_core.checkpoint_manifest import save_file_atomically, verify  # noqa: E402
from ft_integrations.checkpoint_guard import nonfinite_tensors  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    numel = int(args.gb * (1 << 30) / 4)
    chunk = 1 << 24  # 64 MiB tensors, like the layers of a large model
    state = {"state_dict": {f"layer{i}.weight": torch.randn(min(chunk, numel - i * chunk))
                            for i in range((numel + chunk - 1) // chunk)}}
    timings: dict[str, list[float]] = {"load": [], "manifest": [], "finite": [], "manifest_and_finite": []}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "last.ckpt")
        save_file_atomically(path, lambda temp: torch.save(state, temp), global_step=1)
        size_gb = os.path.getsize(path) / (1 << 30)
        state.clear()  # the loads below must not share memory with it
        for _ in range(args.repeats):
            started = time.perf_counter()
            loaded = torch.load(path, weights_only=True)
            timings["load"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert verify(path) is None
            timings["manifest"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert not nonfinite_tensors(loaded)
            timings["finite"].append(time.perf_counter() - started)
            del loaded
            timings["manifest_and_finite"].append(timings["manifest"][-1] + timings["finite"][-1])
    medians = {name: summarize(values)["median"] for name, values in timings.items()}
    emit({
        "benchmark": "checkpoint_verify",
        "checkpoint_gb": round(size_gb, 3),
        "seconds": {name: summarize(values) for name, values in timings.items()},
        "seconds_per_gb": {name: round(value / size_gb, 3) for name, value in medians.items()},
        "manifest_share_of_load": round(medians["manifest"] / medians["load"], 3),
        "manifest_and_finite_share_of_load": round(medians["manifest_and_finite"] / medians["load"], 3),
    })


if __name__ == "__main__":
    main()
