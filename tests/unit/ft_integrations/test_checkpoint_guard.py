"""The finite check and the fallback order of a verified load (one process, no process group)."""

from __future__ import annotations

import pytest
import torch

from ft_core.checkpoint_manifest import mark_bad, save_file_atomically
from ft_integrations.checkpoint_guard import (
    NoGoodCheckpointError,
    choose_checkpoint,
    fallback_candidates,
    load_verified,
    nonfinite_tensors,
)

NAN, INF = float("nan"), float("inf")


def test_nonfinite_tensors_names_exactly_the_tensors_holding_nan_or_infinity():
    state = {
        "ok": torch.ones(10), "huge_but_finite": torch.full((4,), 3e38),  # a float32 sum would overflow
        "nan": torch.tensor([1.0, NAN]), "infs": torch.tensor([INF, -INF]),  # +inf and -inf sum to NaN
        "f64_huge": torch.tensor([1e308, 1e308], dtype=torch.float64),  # its sum overflows: checked elementwise
        "f64_inf": torch.tensor([1e308, INF], dtype=torch.float64),
        "bf16_nan": torch.tensor([1.0, NAN], dtype=torch.bfloat16), "complex_nan": torch.tensor([1 + 1j, complex(NAN)]),
        "ints": torch.arange(3), "empty": torch.empty(0), "nested": [{"w": torch.tensor([INF])}],
    }
    assert nonfinite_tensors(state, limit=10) == ["nan", "infs", "f64_inf", "bf16_nan", "complex_nan", "nested[0].w"]
    assert nonfinite_tensors(state) == ["nan", "infs", "f64_inf"]  # stops at the limit


def _save(path, weight: float, step: int) -> None:
    state = {"state_dict": {"w": torch.tensor([weight])}, "step": step}
    save_file_atomically(str(path), lambda temp: torch.save(state, temp), global_step=step)


def test_load_verified_takes_the_requested_one_else_the_newest_fallback_that_passes(tmp_path):
    for step, weight in ((10, 1.0), (20, NAN), (30, 3.0)):
        _save(tmp_path / f"step={step}.ckpt", weight, step)
    _save(tmp_path / "last.ckpt", NAN, 30)
    last = str(tmp_path / "last.ckpt")
    assert fallback_candidates(last) == [str(tmp_path / f"step={s}.ckpt") for s in (30, 20, 10)]
    load = lambda p: torch.load(p, weights_only=True)  # noqa: E731
    result = load_verified(last, fallback_candidates(last), load, weights=lambda s: s["state_dict"])
    assert result.path == str(tmp_path / "step=30.ckpt") and result.state["step"] == 30
    assert [r.reason for r in result.rejected] == ["non-finite values in w"]
    # Without the finite check the requested one loads as it is.
    assert load_verified(last, [], load).path == last
    with pytest.raises(NoGoodCheckpointError, match="step=20.ckpt: non-finite values in w"):
        load_verified(str(tmp_path / "step=20.ckpt"), [], load, weights=lambda s: s["state_dict"])


def test_choose_checkpoint_skips_a_torn_and_a_marked_bad_one_without_loading_them(tmp_path):
    paths = [str(tmp_path / f"step={step}.ckpt") for step in (30, 20, 10)]  # newest first
    for path, step in zip(paths, (30, 20, 10)):
        _save(path, NAN, step)  # NaN weights: choose_checkpoint checks manifests only (no load, no finite check)
    with open(paths[0], "r+b") as handle:
        handle.truncate(5)
    mark_bad(paths[1], "non-finite loss 1 step(s) after resuming")
    assert choose_checkpoint(paths) == paths[2]
    assert choose_checkpoint([]) is None
    with pytest.raises(NoGoodCheckpointError, match=r"step=30.ckpt: .*torn or truncated.*step=20.ckpt: marked bad"):
        choose_checkpoint(paths[:2])


def test_a_file_marked_bad_condemns_its_copies_under_other_names(tmp_path):
    # Lightning's last.ckpt and the top-k file of the same save hold the same bytes (it saves through a
    # file object): the launcher marks the one the cycle resumed from, and the next resume must not
    # spend a restart on the other.
    def save(name: str, weight: float, step: int) -> None:
        def write(temp: str) -> None:
            with open(temp, "wb") as handle:
                torch.save({"state_dict": {"w": torch.tensor([weight])}, "step": step}, handle)
        save_file_atomically(str(tmp_path / name), write, global_step=step)

    for step in (10, 20):
        save(f"step={step}.ckpt", 1.0, step)
    save("last.ckpt", 1.0, 20)
    last = str(tmp_path / "last.ckpt")
    mark_bad(last, "non-finite loss 2 step(s) after resuming")
    load = lambda p: torch.load(p, weights_only=True)  # noqa: E731
    result = load_verified(last, fallback_candidates(last), load)
    assert result.path == str(tmp_path / "step=10.ckpt")
    assert [r.reason for r in result.rejected] == [
        "marked bad: non-finite loss 2 step(s) after resuming", f"marked bad: the same content as {last}"]
    # Another content saved under the marked name is not condemned.
    save("last.ckpt", 2.0, 20)
    assert load_verified(last, fallback_candidates(last), load).path == last
