"""In-memory snapshots of training state that outlive the workers: see ``docs/snapshots.md``.

* :mod:`~ft_core.snapshots.space`: the job's snapshot directory in shared memory
  (``/dev/shm/ft-<uid>/job-<random>``), which ``ft_launcher`` owns;
* :mod:`~ft_core.snapshots.slots`: each rank's two checksummed slots in it;
* :mod:`~ft_core.snapshots.room`: whether the node has room for them, from the state's metadata, before any copy;
* :mod:`~ft_core.snapshots.writer`: the thread that serialises and writes off the training thread;
* :mod:`~ft_core.snapshots.interval`: ``snapshot_every="auto"``, the interval from the measured cost;
* :mod:`~ft_core.snapshots.resume`: the ranks' agreement on the newest step every rank holds, the
  choice between it and the disk checkpoint, and the ``resume_chosen`` event;
* :mod:`~ft_core.snapshots.condemned`: a snapshot's name, and the marks of the ones the fault policy condemned;
* :mod:`~ft_core.snapshots.node`: :class:`NodeSnapshots`, what the integrations and the client use.

Submodules import torch only where they need it, inside functions.
"""
