"""Rendezvous: how the launchers of a job find each other and what they share.

Torch's dynamic rendezvous is kept for every round; this package adds to it at its
seams: the etcd v3 backend (:mod:`.etcd_v3`), the job store the launchers share
(:mod:`.job_store`), settings derived from SLURM (:mod:`.slurm`), waking on the change
instead of the one-second poll (:mod:`.wake`), a restart's writes in turn (:mod:`.turns`),
the last round's members before a newcomer (:mod:`.members_first`), the join skew
(:mod:`.skew`), cheap event records (:mod:`.records`), the status line while waiting
(:mod:`.waiting`) and who is waiting to join (:mod:`.membership`). Each module's one job is in the generated layout
table of ``docs/development.md``.
"""
