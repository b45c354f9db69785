"""examples/monitoring/prometheus.yml with a real Prometheus: a launcher's random port is found and scraped.

The launcher runs with ``--ft-metrics-port=0`` and writes its endpoint as a ``file_sd`` target
file; Prometheus (Debian's ``prometheus``, installed by the Makefile like etcd) runs the
example's scrape config with only the target directory (and its intervals, for a short test)
changed, finds the launcher through that file and scrapes it: ``ft_cycle`` is queryable with
the ``run_id`` and ``node`` labels of the series. When the launcher exits its target file goes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml
from helpers import REPO_ROOT, free_port, wait_for
from launcher_helpers import LauncherGroup

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install -y prometheus)")]


def _query(port: int, expr: str) -> list:
    """The series ``expr`` selects now; none while Prometheus is still starting."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["result"]
    except (urllib.error.URLError, ConnectionError):
        return []


def test_prometheus_finds_and_scrapes_a_launcher_on_a_random_port(tmp_path):
    if socket.gethostbyname(socket.gethostname()) != "127.0.0.1":
        pytest.skip("the target file names this host, which does not resolve to loopback here")
    targets = tmp_path / "ft_targets"
    with open(os.path.join(REPO_ROOT, "examples", "monitoring", "prometheus.yml"), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    config["global"]["scrape_interval"] = "1s"
    (job,) = config["scrape_configs"]
    job["file_sd_configs"][0].update(files=[str(targets / "*.json")], refresh_interval="1s")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp_path / "prometheus.out", "wb") as out:
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with LauncherGroup(tmp_path) as launchers:
            node = launchers.start("--ft-metrics-port=0", f"--ft-metrics-targets-dir={targets}", nproc=1,
                                   FT_TEST_TORCH="0", FT_TEST_STEPS="forever")
            series = wait_for(lambda: _query(port, "ft_cycle"), 90, "Prometheus to scrape the launcher", interval=0.5)
            started = node.events("launcher_started")[0]
            labels = series[0]["metric"]
            assert labels["job"] == "ft_launcher" and labels["node"] == started["node"].rsplit(":", 1)[0]
            assert labels["run_id"] == started["run_id"] and series[0]["value"][1] == "0"
            node.proc.send_signal(signal.SIGTERM)
            node.wait(60)
        assert not list(targets.glob("*.json"))  # gone with the launcher: Prometheus stops scraping it
    finally:
        os.killpg(prometheus.pid, signal.SIGKILL)
        prometheus.wait(30)
