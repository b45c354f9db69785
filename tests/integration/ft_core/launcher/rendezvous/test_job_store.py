"""Which job store a rendezvous store gets, and what choosing it costs a c10d job."""

from __future__ import annotations

import subprocess
import sys

from helpers import python_env

# In a fresh interpreter: this test session has imported python-etcd already (the etcd fixtures).
_C10D_JOB = """
import sys
import torch.distributed as dist
from ft_core.launcher.rendezvous.job_store import C10dJobStore, job_store_on

store = job_store_on(dist.HashStore(), "run-1")
store.set("cycle", "3")
assert isinstance(store, C10dJobStore), type(store)
assert store.get("cycle") == "3"
print(sorted(name for name in ("etcd", "ft_core.launcher.rendezvous.etcd_v3", "grpc") if name in sys.modules))
"""


def test_a_c10d_rendezvous_store_gets_the_c10d_job_store_without_importing_any_etcd_client():
    # python-etcd and its urllib3 took 80 ms of every launch before its first workers, etcd or not.
    out = subprocess.run([sys.executable, "-c", _C10D_JOB], env=python_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
