"""Rendezvous settings derived from SLURM's environment (ft_core.launcher.rendezvous.slurm)."""

from __future__ import annotations

import pytest

from ft_core.launcher.cli import build_parser
from ft_core.launcher.rendezvous.slurm import apply_slurm_defaults, derive_nnodes, first_host, launch_rdzv_id

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-09,12],login1"}


def parse(*argv: str, derive: bool = True):
    """As ft_launcher parses: an absent --nnodes is resolved (outside an srun step: torchrun's 1:1)."""
    args = build_parser().parse_args([*argv, "train.py"])
    if derive:
        derive_nnodes(args, {})
    return args


@pytest.fixture(autouse=True)
def no_scontrol(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # our expansion, not a cluster's scontrol


@pytest.mark.parametrize(("nodelist", "first"), [
    ("gpu[07-09,12],login1", "gpu07"), ("node1", "node1"), ("a1,b2", "a1"), ("rack[2-3]-n[001-004]", "rack2-n001"),
    ("x[5]", "x5"),
])
def test_first_host_of_a_hostlist(nodelist, first):
    assert first_host(nodelist) == first


def test_multi_node_job_gets_id_and_head_node():
    args = parse("--nnodes=4", "--nproc-per-node=8")
    assert apply_slurm_defaults(args, SLURM) == ["--rdzv-id=4242.0", "--rdzv-backend=c10d",
                                                 "--rdzv-endpoint=gpu07:29400"]
    assert (args.rdzv_id, args.rdzv_backend, args.rdzv_endpoint) == ("4242.0", "c10d", "gpu07:29400")
    args = parse("--nnodes=2")
    apply_slurm_defaults(args, {**SLURM, "MASTER_PORT": "12345"})
    assert args.rdzv_endpoint == "gpu07:12345"
    with pytest.raises(ValueError, match="MASTER_PORT: invalid value 'x1'"):
        apply_slurm_defaults(parse("--nnodes=2"), {**SLURM, "MASTER_PORT": "x1"})


def test_what_the_user_gave_wins():
    args = parse("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=head:1234", "--rdzv-id=mine")
    assert apply_slurm_defaults(args, SLURM) == []
    assert (args.rdzv_id, args.rdzv_endpoint) == ("mine", "head:1234")
    static = parse("--nnodes=2", "--master-addr=10.0.0.1", "--node-rank=0")
    apply_slurm_defaults(static, SLURM)
    assert (static.rdzv_backend, static.rdzv_endpoint) == ("static", "")


def test_single_node_and_no_slurm_are_left_alone():
    single = parse("--nproc-per-node=2", "--rdzv-id=fresh")  # as torchrun's single-node default leaves it
    assert apply_slurm_defaults(single, SLURM) == []
    assert single.rdzv_endpoint == "" and single.rdzv_id == "fresh"
    outside = parse("--nnodes=2")
    assert apply_slurm_defaults(outside, {}) == [] and outside.rdzv_id == "none"


def test_missing_nodelist_is_a_clear_error():
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST is not; allowed: .*give --rdzv-endpoint"):
        apply_slurm_defaults(parse("--nnodes=2"), {"SLURM_JOB_ID": "1"})


def test_nnodes_comes_from_the_srun_step_when_not_given():
    step = {**SLURM, "SLURM_STEP_NUM_NODES": "4"}
    args = parse("--nproc-per-node=8", derive=False)
    assert derive_nnodes(args, step) == ["--nnodes=4"] and args.nnodes == "4"
    assert apply_slurm_defaults(args, step)[-1] == "--rdzv-endpoint=gpu07:29400"  # then a multi-node job


@pytest.mark.parametrize(("argv", "env"), [
    (("--nnodes=1",), {**SLURM, "SLURM_STEP_NUM_NODES": "4"}),     # given, even if it is torchrun's default
    (("--nnodes=2:4",), {**SLURM, "SLURM_STEP_NUM_NODES": "4"}),
    ((), SLURM),                                                  # a batch script, not an srun step
    ((), {**SLURM, "SLURM_STEP_NUM_NODES": "1"}),
    ((), {"SLURM_STEP_NUM_NODES": "4"}),                          # not a SLURM job
])
def test_nnodes_given_or_single_node_steps_are_left_alone(argv, env):
    args = parse(*argv, derive=False)
    assert derive_nnodes(args, env) == [] and args.nnodes == (argv[0].split("=")[1] if argv else "1:1")


def test_a_bad_step_node_count_names_the_variable():
    with pytest.raises(ValueError, match="SLURM_STEP_NUM_NODES: invalid value 'x'"):
        derive_nnodes(parse(derive=False), {**SLURM, "SLURM_STEP_NUM_NODES": "x"})


def test_every_launch_of_a_job_gets_its_own_rendezvous_id():
    # One id for all nodes of a launch; a new one for each requeue and each srun step of the allocation,
    # so a store that outlives the launchers (etcd) never hands a requeued job the last run's state.
    ids = [launch_rdzv_id({**SLURM, **extra}) for extra in (
        {}, {"SLURM_RESTART_COUNT": "0"}, {"SLURM_RESTART_COUNT": "1"}, {"SLURM_RESTART_COUNT": "1", "SLURM_STEP_ID": "0"},
        {"SLURM_RESTART_COUNT": "1", "SLURM_STEP_ID": "3"})]
    assert ids == ["4242.0", "4242.0", "4242.1", "4242.1.0", "4242.1.3"]
    args = parse("--nnodes=2", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=etcd:2379")
    assert apply_slurm_defaults(args, {**SLURM, "SLURM_RESTART_COUNT": "2", "SLURM_STEP_ID": "0"}) == \
        ["--rdzv-id=4242.2.0"]


def test_the_job_id_outlives_the_launch_ids_of_its_requeues():
    from ft_core.launcher.rendezvous.slurm import job_id

    assert job_id("4242.3", {**SLURM, "SLURM_RESTART_COUNT": "3"}) == "4242"  # what the metrics label keeps
    assert job_id("d6b0f3", {}) == "d6b0f3"  # outside SLURM: the run id
