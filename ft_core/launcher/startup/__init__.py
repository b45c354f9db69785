"""Start-up: the launcher's first seconds and its workers' processes.

What runs before the launcher imports torch (:mod:`.head_start`), the pre-warmed
worker factory on both sides (:mod:`.prewarm`, the launcher's; :mod:`.zygote`, the
factory's), and worker processes that die with the launcher (:mod:`.workers`).
Each module's one job is in the generated layout table of ``docs/development.md``.
"""
