"""Saves checkpoints in a loop through ft_core.checkpoint_manifest until killed (the kill test's victim).

Each checkpoint is ``step`` repeated to ``SIZE`` bytes, written in 64 KiB chunks (so a
kill lands inside a write as often as between writes) to ``last.ckpt`` and to a
per-step file, as Lightning's ModelCheckpoint does with ``save_last=True``.
"""

import os
import sys

from ft_core.checkpoint_manifest import save_file_atomically

directory, size = sys.argv[1], int(sys.argv[2])
step = int(sys.argv[3]) if len(sys.argv) > 3 else 0
while True:
    step += 1
    body = (b"%08d" % step) * (size // 8)

    def write(temp: str, body: bytes = body) -> None:
        with open(temp, "wb") as handle:
            for offset in range(0, len(body), 1 << 16):
                handle.write(body[offset:offset + (1 << 16)])

    save_file_atomically(os.path.join(directory, f"step={step}.ckpt"), write, global_step=step)
    save_file_atomically(os.path.join(directory, "last.ckpt"), write, global_step=step)
    print(step, flush=True)
