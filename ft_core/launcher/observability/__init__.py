"""Observability: what the launcher tells people and tools about a job.

The event log and the summary printed at exit (:mod:`.event_log`), the Prometheus
endpoint (:mod:`.metrics`) and the offline goodput report of a log directory
(:mod:`.report`, ``ft_launcher report LOG_DIR``). Each module's one job is in the
generated layout table of ``docs/development.md``.
"""
