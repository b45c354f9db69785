"""Megatron-LM's ``ft_integration`` call pattern against ``nvidia_resiliency_ext.fault_tolerance`` (test-only).

Megatron-LM's own module drives NVRx's client directly: it imports ``RankMonitorClient``
from ``nvidia_resiliency_ext.fault_tolerance`` in ``setup()``, opens ``setup`` after
``init_workload_monitoring(num_warmup_iters=...)``, wraps steps after the warm-up in
``step`` and saves in ``checkpointing``, keeps the learned timeouts in
``<save>/ft_state.json``, and learns ``step`` after 16 iterations. This stand-in makes the
same client calls in the same order, so ``pretrain.py`` can run as an unmodified
Megatron-LM job would with ``ft_integrations.nvrx_alias`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional

_client: Optional[Any] = None
_state_path = ""
_warmup = 0
_seen_iters = 0
_seen_saves = 0
_setup_open = False
_MIN_ITERS_FOR_STEP = 16


def setup() -> None:
    global _client, _state_path, _warmup, _setup_open
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--enable-ft-package", action="store_true")
    parser.add_argument("--calc-ft-timeouts", action="store_true")
    parser.add_argument("--ft-num-warmup-iters", type=int, default=5)
    parser.add_argument("--save", default=None)
    args, _ = parser.parse_known_args(sys.argv[1:])
    if not args.enable_ft_package:
        return
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # what Megatron-LM imports

    os.makedirs(args.save, exist_ok=True)
    _state_path = os.path.join(args.save, "ft_state.json")
    _warmup = args.ft_num_warmup_iters
    _client = RankMonitorClient()
    _client.init_workload_monitoring(num_warmup_iters=_warmup)
    if os.path.exists(_state_path):
        with open(_state_path, encoding="utf-8") as handle:
            _client.load_state_dict(json.load(handle))
    print(f"FT: initialized with {type(_client).__module__}.RankMonitorClient", flush=True)
    _client.start_section("setup")
    _setup_open = True


def _close_setup() -> None:
    global _setup_open
    if _setup_open:
        _client.end_section("setup")
        _setup_open = False


def on_training_step_start() -> None:
    if _client is not None:
        _close_setup()
        if _seen_iters >= _warmup:
            _client.start_section("step")


def on_training_step_end() -> None:
    global _seen_iters
    if _client is not None:
        if _seen_iters >= _warmup:
            _client.end_section("step")
        _seen_iters += 1


def on_eval_step_start() -> None:
    if _client is not None:
        _close_setup()


def on_eval_step_end() -> None:
    pass


def on_checkpointing_start() -> None:
    if _client is not None:
        _client.start_section("checkpointing")


def on_checkpointing_end(is_async_finalization: bool) -> None:
    global _seen_saves
    if _client is not None:
        _client.end_section("checkpointing")
        if not is_async_finalization:
            _seen_saves += 1
            sections = ["checkpointing"] + (["step"] if _seen_iters >= _MIN_ITERS_FOR_STEP else [])
            _client.calculate_and_set_section_timeouts(selected_sections=sections, calc_out_of_section=False)
            if int(os.environ.get("RANK", "0")) == 0:
                with open(_state_path, "w", encoding="utf-8") as handle:
                    json.dump(_client.state_dict(), handle)


def on_checkpoint_loaded(is_local_chkpt: bool) -> None:
    pass


def maybe_setup_simulated_fault() -> None:
    pass


def shutdown() -> None:
    global _client
    if _client is not None:
        _client.shutdown_workload_monitoring()
    _client = None
