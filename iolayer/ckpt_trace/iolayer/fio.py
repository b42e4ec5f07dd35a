"""fio as the device-limit reference: what the storage gives a tool with no Python in the way.

Reference: fio(1), HOWTO sections "I/O engine" (io_uring), "direct", "iodepth",
"end_fsync", and "--output-format=json" (``jobs[0].write.bw_bytes``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from ckpt_trace.errors import CkptTraceError


def fio_bytes_per_s(directory: Path, size: str, rw: str = "write") -> float | None:
    """Sequential O_DIRECT io_uring bandwidth of fio (bytes/s), 4 MiB blocks, queue depth 32; None without fio.

    ``size`` is fio's ``--size`` (e.g. "1G" or "67108864"). ``rw="write"``
    ends with an fsync (end_fsync=1); ``rw="read"`` lays the file out first,
    then reads it. fio's files are removed afterwards. Raises CkptTraceError
    when fio fails.
    """
    if shutil.which("fio") is None:
        return None
    cmd = [
        "fio",
        "--name=limit",
        f"--directory={directory}",
        f"--rw={rw}",
        "--bs=4M",
        "--ioengine=io_uring",
        "--direct=1",
        "--iodepth=32",
        f"--size={size}",
        "--output-format=json",
    ]
    if rw == "write":
        cmd.append("--end_fsync=1")
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return float(json.loads(done.stdout)["jobs"][0][rw]["bw_bytes"])
    except (subprocess.CalledProcessError, ValueError, KeyError, IndexError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        raise CkptTraceError(f"fio failed: {detail.strip().splitlines()[-1] if detail.strip() else err}") from None
    finally:
        for path in Path(directory).glob("limit.*"):
            path.unlink()
