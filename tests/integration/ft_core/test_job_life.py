"""A job's whole life, not one cycle: learned timeouts over many resumes of a real Lightning job (issue 20)."""

from __future__ import annotations

import json
import signal

import pytest
from helpers import kill_group, python_env, spawn_python
from lightning_scripts.harness import SCRIPTS, base_env

pytestmark = pytest.mark.timeout(240)

SAFETY_FACTOR = 5.0
SAVE_SLEEP = 0.75  # 3x the learned step budget (5 x 0.05 s steps)


def test_ten_resumes_never_shrink_the_timeouts_and_a_hang_in_the_tenth_is_caught(start_monitor, tmp_path):
    # Heartbeats mode with learning on (the callback's defaults). Before the fix each resume learned at its
    # first batch from one step gap and averaged the checkpoint's timeout with it: 3.75 -> 2 -> 1.1 -> 0.7 s,
    # and the 0.75 s save of the 3rd resume was killed as a hang (then every later resume at the same save).
    monitor = start_monitor(min_calculated_timeout=0.2, safety_factor=SAFETY_FACTOR)
    env = base_env(tmp_path)
    env.update(python_env(FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path, FT_MONITOR_TOKEN=monitor.token))
    proc = spawn_python([str(SCRIPTS / "resumes.py"), "--resumes=10", "--hang-run=10", f"--save-sleep={SAVE_SLEEP}",
                         f"--out-dir={tmp_path}"], env=env, stdout=-1, stderr=-1, text=True)
    try:
        out, err = proc.communicate(timeout=200)
    finally:
        kill_group(proc)
    # The 10th resume hangs in its last step, after its save: the monitor kills it (SIGKILL).
    assert proc.returncode == -signal.SIGKILL, err[-4000:]
    assert "hanging at step" in out
    hangs = [e for e in monitor.events() if e["event"] == "hang_detected"]
    # The last iteration it reported: the heartbeat at the end of the step before.
    assert [(h["reason"], h["iteration"]) for h in hangs] == [("heartbeat", 12 * 3 - 1)], hangs
    # Nothing else was killed: the fresh run and 9 resumes finished, each with its one slow save.
    runs = [json.loads((tmp_path / f"run{n}.json").read_text()) for n in range(10)]
    assert [r["end_step"] for r in runs] == [(n + 2) * 3 + 1 for n in range(10)]
    # No timeout ever fell below the job-life floor, nor below what the save needs.
    for n, run in enumerate(runs[1:], start=1):
        for when in ("start", "end"):
            current = run[when]["current_timeouts"]
            floor = current["job_life"]["heartbeat.subsequent"]["max"] * SAFETY_FACTOR
            assert current["heartbeat"]["subsequent"] >= floor >= SAFETY_FACTOR * SAVE_SLEEP, (n, when, current)
    assert runs[-1]["end"]["current_timeouts"]["job_life"]["heartbeat.subsequent"]["runs"] >= 2


# -- torch.compile: a recompile after learning is its own phase, not a hung step ------------------------
SECTIONS = "setup:300,step:300,validation:300,checkpointing:300"


def _compiled_run(monitor, tmp_path, *extra):
    env = base_env(tmp_path)
    env.update(python_env(FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path, FT_MONITOR_TOKEN=monitor.token))
    return spawn_python([str(SCRIPTS / "compiled.py"), f"--out-dir={tmp_path}", *extra], env=env, stdout=-1,
                        stderr=-1, text=True)


def test_a_recompile_after_learning_is_not_killed_and_a_hang_inside_a_compile_is(start_monitor, tmp_path):
    # Sections mode, heartbeats off; "step" is learned at step 8 (~0.2 s); the last, smaller batch
    # recompiles for 1 s. Before the fix that recompile ran past the learned step timeout: killed.
    healthy_monitor = start_monitor(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
                                    rank_section_timeouts=SECTIONS, rank_out_of_section_timeout=300,
                                    min_calculated_timeout=0.2)
    hang_monitor = start_monitor(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
                                 rank_section_timeouts=SECTIONS, rank_out_of_section_timeout=300,
                                 min_calculated_timeout=0.2, compile_timeout=3.0)
    healthy = _compiled_run(healthy_monitor, tmp_path / "healthy")
    hung = _compiled_run(hang_monitor, tmp_path / "hung", "--hang-compile=2")  # hangs in the recompile
    try:
        out, err = healthy.communicate(timeout=200)
        hung_out, hung_err = hung.communicate(timeout=200)
    finally:
        kill_group(healthy)
        kill_group(hung)
    assert healthy.returncode == 0, err[-4000:]
    assert "finished after 11 steps and 2 compiles" in out
    learned = [e for e in healthy_monitor.events() if e["event"] == "timeouts_updated"]
    assert learned and learned[0]["timeouts"]["current_timeouts"]["section"]["section"]["step"] < 1.0
    assert not [e for e in healthy_monitor.events() if e["event"] == "hang_detected"]
    # The twin: the same recompile hangs; caught by the compile timeout (3 s), not by the step's.
    assert hung.returncode == -signal.SIGKILL, hung_err[-4000:]
    assert "compile 2" in hung_out
    [hang] = [e for e in hang_monitor.events() if e["event"] == "hang_detected"]
    assert (hang["reason"], hang["section"], hang["timeout"]) == ("section", "compile", 3.0)


# -- the job-life soak: 10 preemptions at random points, requeued like the sbatch example ----------------
@pytest.mark.soak
@pytest.mark.timeout(900)
def test_soak_ten_preemptions_then_hangs_in_the_last_runs_lightning(tmp_path):
    from job_life_soak import SoakJob, run_soak
    from lightning_scripts.harness import reports

    max_steps, every = 150, 3

    def script(run: int, rng) -> list[str]:
        # Variable step times, saves 3-5x a step, start-up varying 2x between runs.
        step = rng.choice((0.05, 0.08, 0.1))
        return [str(SCRIPTS / "train.py"), "--mode=sections", f"--max-steps={max_steps}", f"--every-n-steps={every}",
                f"--step-sleep={step}", f"--save-sleep={step * rng.uniform(3, 5):.3f}",
                f"--setup-sleep={0.3 * (1 + run % 2)}", f"--ckpt-dir={tmp_path / 'ckpt'}",
                f"--out-dir={tmp_path / str(run)}"]

    def resume_step() -> int:
        steps = [int(path.stem.rpartition("step=")[2]) for path in (tmp_path / "ckpt").glob("*step=*.ckpt")]
        return max(steps, default=0)

    job = SoakJob(
        tmp_path, ["--ft-rank-section-timeouts=setup:30,step:20,validation:20,checkpointing:20",
                   "--ft-rank-out-of-section-timeout=30", "--ft-initial-rank-heartbeat-timeout=none",
                   "--ft-rank-heartbeat-timeout=none"],
        script, started=lambda run: any((tmp_path / str(run)).glob("report_r*_c*.json")), resume_step=resume_step,
        hang_at=lambda step: [f"--fault={json.dumps({'kind': 'hang_step', 'rank': 0, 'step': step})}"],
        env=base_env(tmp_path))
    result = run_soak(job, seed=20)
    assert result.codes[-1] == 0 and 0 not in result.codes[:-1], (result.codes, result.logs)
    hangs = [e for e in result.events if e["event"] == "hang_detected"]
    # 0 healthy ranks killed: the only hangs are the two injected ones, each caught once (the warm-up one by
    # the warm-up budget, max(setup, out-of-section), the steady one by the step timeout).
    assert [(h["iteration"], h["section"]) for h in hangs] == [(s, "step") for s in result.hang_steps], hangs
    runs = len(result.codes)
    finished = [r for n in range(runs) for r in reports(tmp_path / str(n)).values() if r.get("end_step") == max_steps]
    assert len(finished) == 1  # training finished exactly once
    assert (tmp_path / "finished.flag").exists()
