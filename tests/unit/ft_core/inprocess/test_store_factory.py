"""The in-process store's factory: where it connects, read from the launcher's environment."""

from __future__ import annotations

import pytest

from ft_core.inprocess import TCPStoreFactory


def test_tcp_store_factory_reads_the_launcher_environment(monkeypatch):
    for name in ("FT_INPROCESS_STORE_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert TCPStoreFactory().resolve() == TCPStoreFactory("node0", 29501, "ft_inprocess/none/0", True)
    # Under torchrun the agent's store outlives every worker: use it, and a namespace per restart cycle.
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert TCPStoreFactory().resolve() == TCPStoreFactory("node0", 29500, "ft_inprocess/job7/2", False)
    monkeypatch.setenv("FT_INPROCESS_STORE_PORT", "4000")
    assert TCPStoreFactory().resolve().port == 4000
    monkeypatch.setenv("FT_INPROCESS_STORE_PORT", "port")
    with pytest.raises(ValueError, match="FT_INPROCESS_STORE_PORT: invalid value 'port'; allowed: an integer from 1"):
        TCPStoreFactory().resolve()
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(ValueError, match="TCPStoreFactory.host_name: host_name=None and MASTER_ADDR is not set"):
        TCPStoreFactory().resolve()
