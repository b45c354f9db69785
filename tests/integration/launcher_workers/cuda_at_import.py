"""A pre-warm module that asks whether CUDA is available at import, for real (``make test-gpu``).

On a GPU machine ``torch.cuda.is_available()`` initialises the driver, after which CUDA cannot be used in
a forked child: the worker factory must refuse to pre-warm with it (compare ``cuda_probe_at_import.py``,
which mocks the driver call for the CPU-only suite).
"""

from __future__ import annotations

import torch

AVAILABLE = torch.cuda.is_available()
