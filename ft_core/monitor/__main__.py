"""``python -m ft_core.monitor``: run one node monitor in this process (how ``run_in_subprocess`` starts it)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Optional

from ft_core.config_loading import load_json
from ft_core.jobdir import TOKEN_ENV
from ft_core.monitor.live_ranks import LIVE_RANKS_SIGNAL
from ft_core.monitor.server import RankMonitorServer
from ft_core.monitor.spawn import STANDBY_FLAG


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == [STANDBY_FLAG]:
        argv = _settings_from_stdin()
    parser = argparse.ArgumentParser(prog="python -m ft_core.monitor",
                                     description="The node monitor: watches every local rank and kills hung ones.")
    parser.add_argument("--socket", required=True, help="path of the Unix socket to serve")
    parser.add_argument("--config-json", default="{}",
                        help="LoadedConfig.to_json() (the config and the keys set at launch), or a JSON object")
    parser.add_argument("--events", default=None, help="JSON-lines event log path")
    parser.add_argument("--stacks-dir", default=None, help="keep the stacks of hung ranks here, named by cycle")
    parser.add_argument("--launcher-reports-hangs", action="store_true",
                        help="ft_launcher tells each hang in one line: log each hung rank at DEBUG only")
    args = parser.parse_args(argv)
    loaded = load_json(args.config_json)
    cfg = loaded.cfg
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format="[ft-monitor %(asctime)s] %(levelname)s: %(message)s")
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        parser.error(f"{TOKEN_ENV} must be set in the environment")
    # Every rank message wakes the monitor; as a normal task it would preempt the sending rank
    # on a busy core and bill the rank for its processing. SCHED_BATCH never preempts on wake-up
    # and still gets its fair share of CPU, so deadlines are met within milliseconds.
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    server = RankMonitorServer(loaded, args.socket, token, args.events, args.stacks_dir, args.launcher_reports_hangs)

    def _stop(_signum: int, _frame: object) -> None:
        server.stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(LIVE_RANKS_SIGNAL, lambda _signum, _frame: server.request_live_ranks())

    def _ready() -> None:
        # The parent waits for this line on our stdout; afterwards stdout is unused.
        os.write(1, b"ready\n")
        os.close(1)
        os.dup2(2, 1)

    try:
        server.serve_forever(ready_callback=_ready)
    except KeyboardInterrupt:
        pass
    return 0


def _settings_from_stdin() -> list[str]:
    """A standby monitor's command line and environment: one JSON line on stdin (imports are done by now).

    Exits 0 when stdin closes without one: the launcher did not need this monitor.
    """
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)
    settings = json.loads(line)
    os.environ.clear()
    os.environ.update(settings["env"])  # the token among them: never on a command line
    return [str(arg) for arg in settings["argv"]]


if __name__ == "__main__":
    sys.exit(main())
