"""Small helpers shared by every part of ``ft_core`` and ``ft_integrations``: one drawer, no policy.

``validation`` (config and message checks with errors that name key, value and what is allowed),
``fileutil`` (private files, atomic replacement), ``procutil`` (process inspection and signalling),
``deadline`` (monotonic deadlines), ``ratelimit`` (log-line rate limits), ``lazy`` (PEP 562 package
exports) and ``strenum`` (the ``StrEnum`` backport for Python 3.10).
"""
