"""ft_launcher: torchrun-compatible launcher with in-job restart, built on torch.distributed.elastic.

Entry points: the ``ft_launcher`` console script and ``python -m ft_core.launcher``
(both :func:`entry_point`, i.e. :func:`main` as the process's entry point: it gets the worker
factory and the monitor's process going around its own imports (``head_start``), checks
torch's seams before anything that uses them is imported, then runs
:func:`ft_core.launcher.cli.main`). Its modules, each with its one job, are listed in the
generated layout table of ``docs/development.md`` (``tools/layout_table.py`` writes it from the
modules' opening docstrings, so it cannot drift from the tree).

``ft_launcher report LOG_DIR`` dispatches to :mod:`ft_core.launcher.observability.report` (goodput report).
"""

from __future__ import annotations

import sys
from typing import Optional

__all__ = ["entry_point", "main"]


def main(argv: Optional[list[str]] = None, *, entry: bool = False) -> int:
    """``ft_launcher``: returns the exit code.

    ``ft_launcher --version`` and ``ft_launcher report`` need no torch elastic;
    anything else first checks the seams (:mod:`.seams`) and, if torch moved one,
    prints the one error naming the torch version, the missing pieces and the
    tested versions, and exits 1 before any of the launcher is imported.

    ``entry``: this call is the process's entry point (:func:`entry_point`), whose
    return ends the process. The worker factory is then forked from this process
    after its imports (:mod:`ft_core.launcher.startup.head_start`), and in the workers it forks this
    function returns (0, or ``SystemExit``) after the worker's script ran. Called from
    Python (not ``entry``), it puts the caller's signal handlers and environment back
    when it returns (:func:`.api.restored_process_state`); :func:`.api.run` is the same
    with torchrun's in-process contract (exceptions instead of an exit code).
    """
    argv = sys.argv[1:] if argv is None else argv
    if entry:  # the process ends when this returns
        return _main(argv, entry=True)
    from ft_core.launcher.api import restored_process_state

    with restored_process_state():  # called from Python: the caller's handlers and environment stay its own
        return _main(argv, entry=False)


def _main(argv: list[str], *, entry: bool) -> int:
    if argv[:1] == ["--version"]:
        from ft_core.version import version_line

        print(version_line("ft_launcher"))
        return 0
    if argv[:1] == ["report"]:
        from ft_core.launcher.cli import main as cli_main

        return cli_main(argv)
    from ft_core.launcher.startup.head_start import HeadStart

    # The worker factory and the monitor start importing now, beside the launcher's own imports.
    with HeadStart(argv, fork_factory=entry) as head_start:
        from ft_core.launcher.seams import TorchSeamsError, require_torch_seams

        try:
            require_torch_seams()
        except TorchSeamsError as exc:
            print(f"ft_launcher: error: {exc}", file=sys.stderr)
            return 1
        from ft_core.launcher.cli import main as cli_main

        run_worker = head_start.imports_done()
        if run_worker is not None:  # a worker forked by the factory forked from here: the script's turn
            run_worker()
            return 0
        return cli_main(argv, head_start=head_start)


def entry_point() -> int:
    """The ``ft_launcher`` console script and ``python -m ft_core.launcher``: :func:`main` as the process's entry point."""
    return main(entry=True)
