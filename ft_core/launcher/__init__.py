"""ft_launcher: torchrun-compatible launcher with in-job restart, built on torch.distributed.elastic.

Entry points: the ``ft_launcher`` console script and ``python -m ft_core.launcher``
(both :func:`ft_core.launcher.cli.main`). Modules:

* ``cli``          argument parsing (torchrun's parser + ``--ft-*`` flags)
* ``launch``       per-node setup and teardown around the agent
* ``agent``        ``FtElasticAgent``, torch's ``LocalElasticAgent`` extended at its seams
* ``coordination`` job-wide cycles, decisions, stop and progress through the rendezvous store
* ``node_monitor`` the node's ``RankMonitorServer``: start, tail events, respawn
* ``control``      workload-control socket server (ExcludeThisNode, ShutdownWorkload)
* ``progress``     latest checkpointed iteration (progress rule)
* ``events``       JSON-lines event log and exit summary
* ``process``      workers that die with the launcher (PR_SET_PDEATHSIG)
* ``rendezvous_records`` cheap names for torch's rendezvous event records (restart latency)
* ``options``      the launcher's own flags
* ``slurm``        rendezvous id and head node derived from SLURM's environment

``ft_launcher report LOG_DIR`` dispatches to :mod:`ft_core.report` (goodput report).
"""
