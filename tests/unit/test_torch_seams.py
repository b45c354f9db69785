"""Every private torch elastic seam the launcher reaches into still exists with the shape we use.

``ft_launcher`` extends torch's ``LocalElasticAgent`` at its template-method
seams and reads a few private attributes of the rendezvous handler (see
``ft_core/launcher/agent.py``, ``coordination.py``, ``process.py`` and
``rendezvous_records.py``). Torch does not promise to keep them; ``pyproject``
caps torch to the minor versions we test. When torch is upgraded, this test
is the one that fails first and names the seam that moved, instead of a
launcher that misbehaves at run time.
"""

from __future__ import annotations

import inspect
import socket

import pytest
import torch.distributed.elastic.multiprocessing.api as mp_api
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler


def _params(func) -> list[str]:
    return [name for name in inspect.signature(func).parameters if name != "self"]


#: LocalElasticAgent method -> the parameters our overrides and calls rely on.
AGENT_METHODS = {
    "_rendezvous": ["worker_group"],
    "_set_local_rank_env": ["worker_env", "local_rank", "spec"],
    "_start_workers": ["worker_group"],
    "_stop_workers": ["worker_group"],
    "_monitor_workers": ["worker_group"],
    "_invoke_run": ["role"],
    "_initialize_workers": ["worker_group"],
    "_restart_workers": ["worker_group"],
    "_exit_barrier": [],
    "_shutdown": ["death_sig", "timeout"],
}


@pytest.mark.parametrize("name", sorted(AGENT_METHODS))
def test_agent_template_methods_keep_their_signatures(name):
    method = getattr(LocalElasticAgent, name, None)
    assert callable(method), f"LocalElasticAgent.{name} is gone"
    assert _params(method)[: len(AGENT_METHODS[name])] == AGENT_METHODS[name], (
        f"LocalElasticAgent.{name}{inspect.signature(method)} changed shape")


def test_subprocess_handler_factory_and_popen_seam():
    # process.py swaps this module-level factory and overrides SubprocessHandler._popen.
    assert _params(mp_api.get_subprocess_handler) == [
        "entrypoint", "args", "env", "stdout", "stderr", "local_rank_id", "numa_options"]
    assert _params(SubprocessHandler._popen) == ["args", "env"]
    assert _params(mp_api.SubprocessContext.close) == ["death_sig", "timeout"]
    assert callable(mp_api.SubprocessContext.pids)


def test_dynamic_rendezvous_private_names():
    # rendezvous_records.py swaps get_method_name; coordination.py runs the exit op.
    assert _params(dr.get_method_name) == ["depth"]
    assert inspect.isclass(dr._RendezvousExitOp)
    assert callable(dr.DynamicRendezvousHandler._stop_heartbeats)
    assert callable(dr._BackendRendezvousStateHolder.sync)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_instances_carry_the_private_attributes_we_read():
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{_free_port()}", run_id="seams",
                                  min_nodes=1, max_nodes=1, is_host=True)
    handler = get_rendezvous_handler(params)
    try:
        assert isinstance(handler, dr.DynamicRendezvousHandler)
        for name in ("_store", "_state_holder", "_op_executor"):
            assert hasattr(handler, name), f"DynamicRendezvousHandler.{name} is gone"
        holder = handler._state_holder
        assert hasattr(holder, "_last_sync_time")
        assert hasattr(holder.state, "redundancy_list")
        assert handler.settings.timeout.close.total_seconds() > 0

        spec = WorkerSpec(role="seams", local_world_size=1, rdzv_handler=handler, entrypoint="true", args=())
        agent = LocalElasticAgent(spec, DefaultLogsSpecs())
        for name in ("_pcontext", "_remaining_restarts", "_worker_group"):
            assert hasattr(agent, name), f"LocalElasticAgent instance attribute {name} is gone"
    finally:
        handler.shutdown()
