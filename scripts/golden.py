"""Record the golden traces of the current trace format version into traces/golden/ (run as root, once per
version: it refuses to replace a file that exists).

    python scripts/golden.py            # all of them
    python scripts/golden.py requests   # one

Each trace comes with what the tests compare it against, written by the
workload or the engine itself, never derived from the trace:

- ``odd-pattern-strace``: the odd-pattern workload's own list of every read
  and write as the kernel saw it (``*.expected.json``);
- ``dcp-gpt2-tiny-2ranks-bcc``: each checkpoint file's size when the save
  ended (``*.sizes.json``);
- ``requests-bcc``: fio's own ``--write_iolog`` of an io_uring job and of a
  libaio job (``*.uring.iolog``, ``*.libaio.iolog``), then a memmap save,
  and every file's size when the recording ended (``*.sizes.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ckpt_trace.formats import FORMAT_VERSION

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "traces" / "golden"
SCRATCH = Path("/tmp/ckpt-trace-golden")
PY = sys.executable


def _record(name: str, backend: str, path_filter: Path, command: list[str]) -> Path:
    trace = GOLDEN / f"v{FORMAT_VERSION}-{name}.arrow"
    subprocess.run(
        [
            PY,
            "-m",
            "ckpt_trace.cli",
            "record",
            "--backend",
            backend,
            "-o",
            str(trace),
            "--path-filter",
            f"{path_filter}/",
            "--",
            *command,
        ],
        check=True,
    )
    return trace


def _sizes(directory: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


def odd_pattern() -> None:
    out = SCRATCH / "out"
    expected = GOLDEN / f"v{FORMAT_VERSION}-odd-pattern-strace.expected.json"
    _record(
        "odd-pattern-strace", "strace", out, [PY, "-m", "ckpt_trace.workloads.odd_pattern", str(out), str(expected)]
    )


def dcp() -> None:
    ck = SCRATCH / "ck"
    trace = _record(
        "dcp-gpt2-tiny-2ranks-bcc",
        "bcc",
        ck,
        [
            PY,
            "-m",
            "ckpt_trace.cli",
            "workload",
            "dcp",
            "--out",
            str(ck),
            "--ranks",
            "2",
            "--model",
            "gpt2-tiny",
            "--with-optimizer",
        ],
    )
    trace.with_suffix(".sizes.json").write_text(json.dumps(_sizes(ck), indent=1))


def requests() -> None:
    io = SCRATCH / "io"
    io.mkdir(parents=True)
    stem = GOLDEN / f"v{FORMAT_VERSION}-requests-bcc"
    fio = ["fio", "--directory", str(io), "--iodepth=8", "--direct=1", "--size=1M", "--output=/dev/null"]
    script = " && ".join(
        [
            " ".join(
                fio
                + [
                    "--name=uring",
                    "--ioengine=io_uring",
                    "--rw=randwrite",
                    "--bs=4k",
                    f"--write_iolog={stem}.uring.iolog",
                ]
            ),
            " ".join(
                fio
                + ["--name=libaio", "--ioengine=libaio", "--rw=write", "--bs=64k", f"--write_iolog={stem}.libaio.iolog"]
            ),
            f"{PY} -m ckpt_trace.cli workload memmap --out {io}/memmap --model gpt2-tiny",
        ]
    )
    _record("requests-bcc", "bcc", io, ["sh", "-c", script])
    stem.with_suffix(".sizes.json").write_text(json.dumps(_sizes(io), indent=1))


RECORDINGS = {"odd-pattern": odd_pattern, "dcp": dcp, "requests": requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"recordings to make: {', '.join(RECORDINGS)} (default: all)")
    names = parser.parse_args().names or list(RECORDINGS)
    unknown = [name for name in names if name not in RECORDINGS]
    if unknown:
        sys.exit(f"golden.py: unknown recording {unknown[0]!r} (choose from {', '.join(RECORDINGS)})")
    existing = [p.name for p in GOLDEN.glob(f"v{FORMAT_VERSION}-*")]
    if existing:
        sys.exit(
            f"golden.py: traces/golden already holds version {FORMAT_VERSION} files ({existing[0]}...); "
            "golden traces are never regenerated"
        )
    if os.geteuid() != 0:
        sys.exit("golden.py: the bcc recordings need root")
    if SCRATCH.exists():
        sys.exit(f"golden.py: {SCRATCH} exists; the recordings need it new (remove it if it is yours)")
    SCRATCH.mkdir()
    for name in names:
        RECORDINGS[name]()
    print(f"golden.py: wrote {', '.join(p.name for p in sorted(GOLDEN.glob(f'v{FORMAT_VERSION}-*')))}")


if __name__ == "__main__":
    main()
