"""What a recorder killed by SIGKILL left behind, found and named by the next recording.

Every scratch name a recording makes carries its process id: the trace's temporary file
(``.NAME.PID-XXXXXXXX.tmp`` beside it, ``formats.atomic``), the spool's runs (``.NAME.runs-PID-XXXX``),
the strace log directory and the GPU subscriber's directory (``ckpt-trace-strace-PID-XXXX``,
``ckpt-trace-gpu-PID-XXXX`` in $TMPDIR). On every exit that can run code they are removed; after a
SIGKILL nothing can, so ``find`` lists those whose process is gone, for ``record`` to name them. Nothing is
deleted here: they may hold the only copy of an interrupted recording's rows.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


def scratch_prefix(kind: str) -> str:
    """The $TMPDIR prefix of this process's scratch directories of ``kind`` (strace, gpu)."""
    return f"ckpt-trace-{kind}-{os.getpid()}-"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def find(output: str | os.PathLike) -> list[Path]:
    """Scratch files and directories of recordings whose process is gone: beside ``output`` (its temporary
    files and spools) and in $TMPDIR (strace logs, GPU subscriber directories)."""
    output = Path(output)
    directory = output.parent if str(output.parent) else Path(".")
    name = re.escape(output.name)
    beside = re.compile(rf"^\.{name}\.(?:runs-)?(\d+)-.*$")
    scratch = re.compile(r"^ckpt-trace-(?:strace|gpu)-(\d+)-.*$")
    found: list[Path] = []
    for folder, pattern in ((directory, beside), (Path(tempfile.gettempdir()), scratch)):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            match = pattern.match(entry)
            if match and _gone(int(match.group(1))):
                found.append(folder / entry)
    return sorted(found)
