"""The in-process restart tests' job starter: real ranks under torchrun, every process gone at the end."""

from __future__ import annotations

import pytest
from inprocess_workers.harness import job_starter


@pytest.fixture
def start_job(tmp_path):
    with job_starter(tmp_path) as start:
        yield start
