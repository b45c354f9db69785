"""Argument validation of the Lightning integration (no processes, no training)."""

from __future__ import annotations

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

from ft_integrations.lightning import (  # noqa: E402
    FaultKind,
    FaultToleranceCallback,
    FaultToleranceCheckpointIO,
    MonitoringMode,
    SimulatedFault,
    StandalonePolicy,
)
from ft_integrations.lightning._pl import Callback, CheckpointIO  # noqa: E402


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "beats"}, r"mode: invalid value 'beats'; allowed: one of heartbeats, sections"),
        ({"standalone": "yes"}, r"standalone: invalid value 'yes'; allowed: one of monitor, off, error"),
        ({"calculate_timeouts": "yes"}, r"calculate_timeouts: invalid value 'yes'; allowed: True or False"),
        ({"autoresume": 1}, r"autoresume: invalid value 1; allowed: True or False"),
        ({"calculate_timeouts_after_steps": 0}, r"calculate_timeouts_after_steps: invalid value 0.*>= 1"),
        ({"calculate_timeouts_after_steps": True}, r"calculate_timeouts_after_steps: invalid value True"),
        ({"state_file": 3}, r"state_file: invalid value 3; allowed: a path or None"),
        ({"exc_handling_policy": "shutdown"}, r"exc_handling_policy: invalid value 'shutdown'.*callable"),
        ({"simulated_fault": {"kind": "explode", "step": 1}}, r"simulated_fault: .*'explode'.*kill, hang_step"),
        ({"simulated_fault": {"kind": "kill", "step": 1, "when": 2}}, r"simulated_fault: .*unknown key.*'when'"),
        ({"simulated_fault": "kill"}, r"simulated_fault: .*SimulatedFault, a mapping"),
        ({"config": {"rank_heartbeat_timeout": -1}}, r"config: .*rank_heartbeat_timeout.*-1.*positive"),
        ({"config": {"no_such_key": 1}}, r"config: .*no_such_key"),
        ({"config": 5}, r"config: invalid value 5; allowed: a FaultToleranceConfig, a mapping, a YAML path"),
        ({"snapshot_every": "sometimes"}, r"snapshot_every: invalid value 'sometimes'; allowed: 'auto' .*None or 0 "
                                          r".*>= 1"),
        ({"snapshot_every": -3}, r"snapshot_every: invalid value -3; allowed: 'auto'"),
        ({"snapshot_every": 2.5}, r"snapshot_every: invalid value 2.5; allowed: 'auto'"),
    ],
)
def test_invalid_arguments_name_the_argument_and_allowed_values(kwargs, message):
    with pytest.raises(MisconfigurationException, match="^FaultToleranceCallback[.]" + message):
        FaultToleranceCallback(**kwargs)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("value", "kept"), [(None, 0), (0, 0), (25, 25), ("auto", "auto")])
def test_snapshot_every_default_is_auto_and_explicit_values_keep_their_meaning(value, kept):
    assert FaultToleranceCallback().snapshot_every == "auto"
    assert FaultToleranceCallback(snapshot_every=value).snapshot_every == kept


@pytest.mark.timeout(30)
def test_valid_arguments_are_kept(tmp_path):
    policy = lambda exc: None  # noqa: E731
    callback = FaultToleranceCallback(
        mode="sections", calculate_timeouts=False, calculate_timeouts_after_steps=7, state_file=tmp_path / "t.json",
        autoresume=True, simulated_fault={"kind": "sigstop", "rank": None, "delay": 3, "seed": 1},
        exc_handling_policy=policy, standalone="off", config={"rank_section_timeouts": "step:30"},
    )
    assert callback.mode == "sections" and callback.calculate_timeouts_after_steps == 7
    assert callback.state_file == str(tmp_path / "t.json")
    assert callback.simulated_fault == SimulatedFault("sigstop", rank=None, delay=3, seed=1)
    assert callback.config is not None and callback.config.rank_section_timeouts == {"step": 30.0}
    assert callback.state_key == "FaultToleranceCallback"
    assert callback.state_dict() == {}  # nothing learned or loaded yet: nothing to checkpoint


@pytest.mark.timeout(30)
def test_closed_sets_are_str_enums_that_accept_their_values():
    callback = FaultToleranceCallback(mode="sections", standalone=StandalonePolicy.OFF,
                                      simulated_fault={"kind": "kill", "step": 1})
    assert callback.mode is MonitoringMode.SECTIONS and callback.standalone is StandalonePolicy.OFF
    assert callback.simulated_fault is not None and callback.simulated_fault.kind is FaultKind.KILL
    assert FaultToleranceCallback(mode=MonitoringMode.HEARTBEATS).mode == "heartbeats"
    # Members print as the value users wrote, in messages and configs alike.
    assert f"{callback.mode}/{callback.standalone}" == "sections/off" and str(FaultKind.HANG_STEP) == "hang_step"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("cls", "base"), [(FaultToleranceCallback, Callback), (FaultToleranceCheckpointIO, CheckpointIO)])
def test_every_overridden_lightning_hook_is_marked_override(cls, base):
    overridden = [name for name in vars(cls) if not name.startswith("_") and hasattr(base, name)]
    assert overridden
    for name in overridden:
        member = vars(cls)[name]
        function = member.fget if isinstance(member, property) else member
        assert getattr(function, "__override__", False), f"{cls.__name__}.{name} lacks @override"
