"""The torch elastic seams ``ft_launcher`` builds on: checked by the package at start, one clear error if moved.

The checks themselves live in ``ft_core/launcher/seams.py`` (the launcher runs
them before importing anything that uses torch elastic). Here: every seam is
there on the torch under test, a seam removed or reshaped (monkeypatched: torch
cannot be made to lose one for real) stops ``ft_launcher`` with the one error
naming the torch version, the missing piece and the tested versions, and the
declared torch range accepts the builds users have (pre-release and local
builds of NVIDIA's containers).
"""

from __future__ import annotations

import pytest
import tomllib
import torch
import torch.distributed.elastic.multiprocessing.api as mp_api
from helpers import REPO_ROOT, SEAM_CHECK_ARGS, assert_one_seam_error, free_port
from packaging.requirements import Requirement
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from ft_core.launcher import main
from ft_core.launcher.seams import (
    AGENT_INSTANCE_ATTRIBUTES,
    RENDEZVOUS_INSTANCE_ATTRIBUTES,
    SEAMS,
    TorchSeamsError,
    missing_seams,
    require_instance_attributes,
)


def test_every_seam_is_there_on_this_torch():
    assert missing_seams() == []
    # The rendezvous records helper is only sped up, never required: it is not a seam, but is still there.
    assert callable(dr.get_method_name)


def test_a_missing_seam_stops_the_launcher_with_one_clear_error(monkeypatch, capsys):
    monkeypatch.delattr(dr, "_RendezvousExitOp")
    assert main(SEAM_CHECK_ARGS) == 1
    assert_one_seam_error(capsys.readouterr().err,
                          "torch.distributed.elastic.rendezvous.dynamic_rendezvous._RendezvousExitOp is gone")


def test_a_reshaped_seam_is_named_with_the_shape_found_and_the_shape_expected(monkeypatch, capsys):
    def get_subprocess_handler(entrypoint, args, env, stdout, stderr, local_rank_id):  # numa_options gone
        raise AssertionError("never called")

    monkeypatch.setattr(mp_api, "get_subprocess_handler", get_subprocess_handler)
    assert main(SEAM_CHECK_ARGS) == 1
    assert_one_seam_error(capsys.readouterr().err, "get_subprocess_handler(entrypoint, args, env, stdout, stderr, "
                          "local_rank_id) changed shape: expected (entrypoint, args, env, stdout, stderr, "
                          "local_rank_id, numa_options, ...)")


def test_version_needs_no_seams(monkeypatch, capsys):
    monkeypatch.delattr(dr, "_RendezvousExitOp")
    assert main(["--version"]) == 0
    assert f"torch {torch.__version__}" in capsys.readouterr().out


def test_every_seam_is_listed_once():
    labels = [seam.label for seam in SEAMS]
    assert len(labels) == len(set(labels))


def test_every_torch_method_the_agent_overrides_is_marked_override():
    # @override makes mypy fail beside this test when torch renames or reshapes a seam we override.
    from ft_core.launcher.agent import FtElasticAgent

    overridden = {name: member for name, member in vars(FtElasticAgent).items()
                  if callable(member) and name != "__init__" and hasattr(LocalElasticAgent, name)}
    assert {"_rendezvous", "_start_workers", "_stop_workers", "_monitor_workers", "_invoke_run"} <= set(overridden)
    assert [name for name, member in overridden.items() if not getattr(member, "__override__", False)] == []


def test_instances_carry_the_private_attributes_we_read():
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id="seams",
                                  min_nodes=1, max_nodes=1, is_host=True)
    handler = get_rendezvous_handler(params)
    try:
        assert isinstance(handler, dr.DynamicRendezvousHandler)
        require_instance_attributes(handler, RENDEZVOUS_INSTANCE_ATTRIBUTES)
        assert handler.settings.timeout.close.total_seconds() > 0
        spec = WorkerSpec(role="seams", local_world_size=1, rdzv_handler=handler, entrypoint="true", args=())
        agent = LocalElasticAgent(spec, DefaultLogsSpecs())
        require_instance_attributes(agent, AGENT_INSTANCE_ATTRIBUTES)
        del agent._pcontext
        with pytest.raises(TorchSeamsError, match=r"LocalElasticAgent instances have no _pcontext") as raised:
            require_instance_attributes(agent, AGENT_INSTANCE_ATTRIBUTES)
        assert raised.value.torch_version == torch.__version__
    finally:
        handler.shutdown()


def _declared_torch() -> Requirement:
    with open(f"{REPO_ROOT}/pyproject.toml", "rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    return next(req for req in map(Requirement, dependencies) if req.name == "torch")


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.14.1", "2.15.0", "3.0.0", "2.13.0a0+ecf3bae40a.nv"])
def test_the_declared_torch_range_has_no_cap_and_accepts_container_builds(version):
    # pip accepts an installed pre-release that the specifier covers (it does not replace the container's torch).
    assert _declared_torch().specifier.contains(version, prereleases=True)


def test_the_declared_torch_range_starts_at_the_lowest_torch_checked():
    lowest = _declared_torch().specifier
    # torch 2.11 lacks LocalElasticAgent's shutdown_timeout; 2.12.0 has every seam (make test-torch-seams-old).
    assert not lowest.contains("2.11.0", prereleases=True)
    assert lowest.contains("2.12.0a0+b465a5843b.nv", prereleases=True)
