"""``ft_launcher report``: the goodput of a job from its event logs (what its only user, the launcher, uses).

``ft_launcher report LOG_DIR`` (or ``python -m ft_core.launcher.observability.report LOG_DIR``)
prints where the wall time went (training, time lost to each fault, the rest),
the goodput and the faults by kind, culprit rank and node; ``--json`` prints
the same as one JSON object with fixed keys; ``--plot FILE.png`` draws a
timeline (needs matplotlib: ``pip install 'ft-suite-pytorch[report]'``). The launcher's
exit summary prints its two-line form (:func:`short_summary`).

* :mod:`~ft_core.launcher.observability.report.analysis`: the typed records of the logs -> :class:`Report`
  (how the time is counted is documented there);
* :mod:`~ft_core.launcher.observability.report.text`: the report for people;
* :mod:`~ft_core.launcher.observability.report.plot`: the timeline picture;
* :mod:`~ft_core.launcher.observability.report.command`: the command line.

Example::

    from ft_core.launcher.observability.report import build_report, find_event_files, format_report, load_records

    files = find_event_files(["logs/"])
    print(format_report(build_report(load_records(files), files)))
"""

from ft_core.launcher.observability.report.analysis import (
           Fault,
           Report,
           build_report,
           find_event_files,
           load_records,
)
from ft_core.launcher.observability.report.command import main
from ft_core.launcher.observability.report.plot import plot_timeline
from ft_core.launcher.observability.report.text import format_report, short_summary

__all__ = ["Fault", "Report", "build_report", "find_event_files", "format_report", "load_records", "main",
           "plot_timeline", "short_summary"]
