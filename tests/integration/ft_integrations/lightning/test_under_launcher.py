"""End to end: a 2-process Lightning DDP job (gloo, CPU) under the real ``ft_launcher``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch  # noqa: E402
from lightning_scripts.harness import MAX_STEPS, launch, of, reports  # noqa: E402


@pytest.mark.timeout(480)
@pytest.mark.parametrize("mode", ["heartbeats", "sections"])
def test_hang_in_step_restarts_and_resumes_with_learned_timeouts(tmp_path, mode):
    result, events = launch(tmp_path, mode, {"kind": "hang_step", "rank": 1, "step": 5})
    assert result.returncode == 0, result.output[-6000:]

    # Rank 1 hangs; rank 0 then waits for it in a collective and is caught as well.
    hang = {e["rank"]: e for e in of(events, "hang_detected")}[1]
    assert hang["iteration"] in (4, 5)  # the last iteration rank 1 reported
    assert hang["reason"] == ("heartbeat" if mode == "heartbeats" else "section")
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1]

    runs = reports(tmp_path)
    assert {key: r["start_step"] for key, r in runs.items()} == {(0, 0): 0, (1, 0): 0, (0, 1): 4, (1, 1): 4}
    assert runs[0, 1]["end_step"] == runs[1, 1]["end_step"] == MAX_STEPS
    assert "end_step" not in runs[0, 0]

    # The checkpoint the second cycle resumed from carries the first cycle's learned timeouts,
    # and the resumed ranks start with exactly those.
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == MAX_STEPS
    resumed_from = runs[0, 1]["start_timeouts"]
    assert runs[1, 1]["start_timeouts"] == resumed_from
    learned = resumed_from["current_timeouts"]
    if mode == "heartbeats":
        assert learned["heartbeat"]["were_calculated"] is True
        # The hang was timed by the learned value (50x the largest gap: not compared with the
        # configured 60 s, which a busy machine's 1.2 s gap would reach).
        assert hang["timeout"] == pytest.approx(learned["heartbeat"]["subsequent"])
    else:
        # A fresh start learns its steps and saves, not `setup` (a resume's is longer).
        assert {"step", "checkpointing"} <= set(learned["section"]["calculated_sections"])
        assert "setup" not in learned["section"]["calculated_sections"]
        assert hang["timeout"] == pytest.approx(learned["section"]["section"]["step"])
    step4 = _checkpoint_state_at_step(tmp_path, 4)
    assert step4 == resumed_from

    flag = tmp_path / "finished.flag"
    assert flag.exists()
    assert flag.stat().st_mtime >= of(events, "cycle_start")[-1]["time"]  # written by the finishing cycle


#: How long cycle 1's checkpoint load sleeps: far above a fresh start's setup times the safety factor.
LOAD_SLEEP = 20.0


@pytest.mark.timeout(480)
def test_slow_resume_is_not_killed_by_setup_learned_on_a_fresh_start(tmp_path):
    # Safety factor 3 and a 10 s floor: a fresh start's setup (about 1 s) learned as-is would be
    # about 10 s, half of the resume's checkpoint load. Steps (0.1 s) stay far below the floor.
    result, events = launch(tmp_path, "sections", {"kind": "hang_step", "rank": 1, "step": 5},
                            f"--load-sleep={LOAD_SLEEP}",
                            ft_flags=("--ft-safety-factor=3", "--ft-min-calculated-timeout=10"))
    assert result.returncode == 0, result.output[-6000:]
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1]  # exactly one restart
    resumed_at = of(events, "cycle_start")[1]["time"]
    hangs = of(events, "hang_detected")
    assert hangs and all(e["time"] < resumed_at for e in hangs), hangs  # only the injected hang
    assert {e.get("section") for e in hangs} == {"step"}

    runs = reports(tmp_path)
    # The premise: the resume's load alone is much longer than the fresh start's whole setup.
    assert runs[0, 0]["setup_seconds"] * 2 < LOAD_SLEEP < runs[0, 1]["setup_seconds"]
    assert runs[0, 1]["start_step"] == 4 and runs[0, 1]["end_step"] == runs[1, 1]["end_step"] == MAX_STEPS
    # The fresh start learned the steps, not `setup`; the resume learned `setup` from what it saw.
    fresh = _checkpoint_state_at_step(tmp_path, 4)["current_timeouts"]["section"]
    assert "step" in fresh["calculated_sections"] and "setup" not in fresh["calculated_sections"]
    assert fresh["section"]["setup"] == 120
    resumed = runs[0, 1]["end_timeouts"]["current_timeouts"]["section"]
    assert "setup" in resumed["calculated_sections"]
    assert resumed["section"]["setup"] >= runs[0, 1]["setup_seconds"]
    assert (tmp_path / "finished.flag").exists()


def _checkpoint_state_at_step(tmp_path: Path, step: int) -> dict:
    """The callback state in the checkpoint ModelCheckpoint kept for ``step`` (save_top_k=-1)."""
    checkpoint = torch.load(tmp_path / "ckpt" / f"epoch=0-step={step}.ckpt", weights_only=False)
    assert checkpoint["global_step"] == step
    return checkpoint["callbacks"]["FaultToleranceCallback"]


@pytest.mark.timeout(480)
def test_hang_in_checkpoint_save_is_caught_by_checkpointing_section(tmp_path):
    result, events = launch(tmp_path, "sections", {"kind": "hang_checkpoint", "rank": 0, "step": 4})
    assert result.returncode == 0, result.output[-6000:]
    hang = {e["rank"]: e for e in of(events, "hang_detected")}[0]  # rank 1 waits in the save's barrier
    assert (hang["reason"], hang["section"]) == ("section", "checkpointing")
    runs = reports(tmp_path)
    # The hung save at step 4 wrote nothing; the in-memory snapshot of step 3 (snapshot_every="auto" takes one
    # at the step timeouts are learned at) is newer than the checkpoint of step 2, and both ranks hold it.
    (resumed,) = [e for e in of(events, "resume_chosen") if e["cycle"] == 1]
    assert (resumed["source"], resumed["step"], resumed["disk_step"]) == ("snapshot", 3, 2), resumed
    assert runs[0, 1]["start_step"] == runs[1, 1]["start_step"] == 3
    assert runs[0, 1]["end_step"] == MAX_STEPS
    assert (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(480)
def test_crash_with_shutdown_policy_stops_without_restart(tmp_path):
    result, events = launch(tmp_path, "heartbeats", {"kind": "exception", "rank": 1, "step": 3},
                            "--policy=shutdown")
    assert result.returncode != 0
    control = of(events, "workload_control")
    assert control and control[0]["action"] == "ShutdownWorkload" and control[0]["rank"] == 1
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0]
    assert {cycle for _rank, cycle in reports(tmp_path)} == {0}
    assert not (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(900)
def test_restart_with_prewarm_gives_the_same_results_as_without(tmp_path):
    finals = {}
    for prewarm in ("on", "off"):
        run_dir = tmp_path / prewarm
        run_dir.mkdir()
        result, events = launch(run_dir, "sections", {"kind": "kill", "rank": 1, "step": 5}, "--seed=7",
                                launcher_flags=(f"--ft-prewarm={prewarm}", "--ft-prewarm-modules=torch,lightning"))
        assert result.returncode == 0, result.output[-6000:]
        assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1]
        runs = reports(run_dir)
        assert {r["prewarmed"] for r in runs.values()} == {prewarm == "on"}
        finals[prewarm] = {rank: (runs[rank, 1]["start_step"], runs[rank, 1]["end_step"], runs[rank, 1]["params"])
                           for rank in (0, 1)}
    assert finals["on"] == finals["off"]  # same resume step, final step and trained parameters
    assert finals["on"][0][:2] == (4, MAX_STEPS)
