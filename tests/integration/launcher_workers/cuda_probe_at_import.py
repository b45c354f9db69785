"""A pre-warm module that asks whether CUDA is available at import, as many training modules do.

On a GPU machine ``torch.cuda.is_available()`` calls the CUDA runtime's device count,
which initialises the driver (``cuInit`` loads ``libcuda.so``) and "poisons fork":
CUDA cannot be used in a forked child afterwards. There is no GPU here, so the one
thing mocked is that driver call: a stand-in for ``torch._C._cuda_getDeviceCount``
loads a library named ``libcuda.so.1`` (a copy of libm, from ``FT_TEST_FAKE_CUDA_DIR``)
into the process, as the real call does, and says one device is there.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import torch


def _a_loaded_library() -> str:
    """The path of libm, which Python has loaded: copied, it stands in for the driver's library."""
    with open("/proc/self/maps") as maps:
        return next(line.split()[-1] for line in maps if os.path.basename(line.split()[-1]).startswith("libm.so"))


def _fake_cuda_get_device_count() -> int:
    directory = os.environ["FT_TEST_FAKE_CUDA_DIR"]
    os.makedirs(directory, exist_ok=True)
    driver = os.path.join(directory, "libcuda.so.1")
    if not os.path.exists(driver):
        shutil.copy(_a_loaded_library(), driver)
    ctypes.CDLL(driver)
    return 1


torch._C._cuda_getDeviceCount = _fake_cuda_get_device_count  # type: ignore[attr-defined]
AVAILABLE = torch.cuda.is_available()
assert AVAILABLE
