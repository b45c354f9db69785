"""The finite check of a loaded state: which floating-point tensors hold NaN or infinity."""

from __future__ import annotations

import torch

from ft_core.finite import nonfinite_tensors, whole_state


def test_names_the_nonfinite_tensors_by_their_path_in_the_state():
    state = {
        "model": {"w": torch.ones(3), "b": torch.tensor([1.0, float("nan")])},
        "optimizer": [{"exp_avg": torch.tensor([float("inf")])}, torch.zeros(2)],
        "step": 7,
    }
    assert nonfinite_tensors(state) == ["model.b", "optimizer[0].exp_avg"]
    assert nonfinite_tensors(torch.tensor([float("-inf")])) == ["<tensor>"]


def test_stops_at_the_limit():
    state = {f"t{i}": torch.tensor([float("nan")]) for i in range(5)}
    assert nonfinite_tensors(state) == ["t0", "t1", "t2"]
    assert nonfinite_tensors(state, limit=1) == ["t0"]


def test_finite_values_whose_sum_overflows_are_not_reported():
    # float16 holds 60000 but not the sum of two: the fast check's overflow is confirmed element by element.
    big = torch.full((4,), 60000.0, dtype=torch.float16)
    assert not torch.isfinite(big.sum())
    assert nonfinite_tensors({"w": big}) == []


def test_integer_empty_and_complex_tensors():
    state = {"ids": torch.arange(3), "empty": torch.empty(0), "c": torch.tensor([complex(1, float("nan"))])}
    assert nonfinite_tensors(state) == ["c"]
    assert nonfinite_tensors({"c": torch.tensor([complex(1, 2)])}) == []


def test_the_whole_state_is_checked_when_nothing_narrower_is_named():
    state = {"w": torch.ones(1)}
    assert whole_state(state) is state
