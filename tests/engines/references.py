"""References the project does not produce, for the engine conformance suite.

- ``strace_file_io(log, root)``: per file under ``root``, the data system calls strace itself logged
  (``strace -f -qq -y -s 0 -o LOG``): calls and bytes moved (the return value) written and read,
  including the in-kernel copies (sendfile, copy_file_range, splice: counted on both files).
  libaio requests count too: each iocb that ``io_submit`` took (the first ``ret`` of its array), its
  ``aio_nbytes``, on the file of its ``aio_fildes`` (IOCB_CMD_PWRITE/PWRITEV writes, PREAD/PREADV reads).
- ``perf_uring(data)``: io_uring requests the kernel's own tracepoints saw (``perf record -e
  io_uring:io_uring_submit_req``), by opcode.
- ``trace_file_io(table, root)``: the same figures from a ckpt-trace trace, to compare.

Names under ``root`` are normalised by ``normalise`` (hex and UUID runs of temporary names become ``#``),
since two runs of one engine pick different temporary names.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

WRITES = {"write", "pwrite64", "writev", "pwritev", "pwritev2"}
READS = {"read", "pread64", "readv", "preadv", "preadv2"}
COPIES = {"sendfile", "sendfile64", "copy_file_range", "splice"}
_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^([a-z_0-9]+)\((.*)\)\s+=\s+(-?\d+)")
_FD_PATH = re.compile(r"\d+<([^>]*)>")
_IOCB = re.compile(
    r"aio_lio_opcode=IOCB_CMD_(P(?:READ|WRITE)V?), aio_fildes=\d+<([^>]*)>, .*?"
    r"aio_nbytes=(\d+), aio_offset="
)  # (aio_buf's bytes may hold any character)
_TEMP = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{8,}|tmp[A-Za-z0-9_]{6,}")


def normalise(relative: str) -> str:
    return _TEMP.sub("#", relative)


def _lines(log: Path):
    """Whole calls from an ``strace -f`` log: unfinished/resumed halves joined per pid."""
    pending: dict[str, str] = {}
    for raw in log.read_text(errors="replace").splitlines():
        m = _LINE.match(raw)
        pid, text = (m.group(1), m.group(2)) if m else ("0", raw)
        if text.endswith("<unfinished ...>"):
            pending[pid] = text[: -len("<unfinished ...>")].rstrip()
            continue
        if text.startswith("<... "):
            head = pending.pop(pid, None)
            if head is None:
                continue
            text = head + text.split("resumed>", 1)[1]
        yield text


def strace_file_io(log: Path, root: Path) -> dict[str, Counter]:
    """{normalised path under root: Counter(write_calls, write_bytes, read_calls, read_bytes)}."""
    prefix = str(root).rstrip("/") + "/"
    out: dict[str, Counter] = defaultdict(Counter)
    for text in _lines(log):
        m = _CALL.match(text)
        if not m:
            continue
        name, args, ret = m.group(1), m.group(2), int(m.group(3))
        if name == "io_submit" and ret > 0:
            for opcode, path, nbytes in _IOCB.findall(args)[:ret]:
                if path.startswith(prefix):
                    kind = "write" if "WRITE" in opcode else "read"
                    out[normalise(path[len(prefix) :])][f"{kind}_calls"] += 1
                    out[normalise(path[len(prefix) :])][f"{kind}_bytes"] += int(nbytes)
            continue
        if name not in WRITES | READS | COPIES or ret < 0:
            continue
        paths = _FD_PATH.findall(args)
        if name in COPIES:
            if len(paths) >= 2:
                for path, kind in ((paths[0], "write"), (paths[1], "read")):  # (out_fd, in_fd) for sendfile
                    if name in ("copy_file_range", "splice"):
                        kind = "read" if kind == "write" else "write"  # (fd_in, ..., fd_out)
                    if path.startswith(prefix):
                        out[normalise(path[len(prefix) :])][f"{kind}_calls"] += 1
                        out[normalise(path[len(prefix) :])][f"{kind}_bytes"] += ret
            continue
        if not paths or not paths[0].startswith(prefix):
            continue
        kind = "write" if name in WRITES else "read"
        key = normalise(paths[0][len(prefix) :])
        out[key][f"{kind}_calls"] += 1
        out[key][f"{kind}_bytes"] += ret
    return dict(out)


def trace_file_io(
    table, root: Path, interfaces: tuple[str, ...] = ("syscall", "sendfile", "copy_file_range", "splice", "libaio")
) -> dict[str, Counter]:
    """The same figures from a trace's read and write rows of the given interfaces (bytes: ``ret``)."""
    prefix = str(root).rstrip("/") + "/"
    out: dict[str, Counter] = defaultdict(Counter)
    rows = table.select(["op", "path", "ret", "interface"]).to_pylist()
    for row in rows:
        if row["op"] not in ("read", "write") or row["interface"] not in interfaces:
            continue
        path = row["path"] or ""
        if not path.startswith(prefix) or row["ret"] is None or row["ret"] < 0:
            continue
        key = normalise(path[len(prefix) :])
        out[key][f"{row['op']}_calls"] += 1
        out[key][f"{row['op']}_bytes"] += row["ret"]
    return dict(out)


def perf_record(command: list[str], data: Path, env=None) -> subprocess.CompletedProcess:
    """Run ``command`` under ``perf record`` of the io_uring submission tracepoint."""
    return subprocess.run(
        ["perf", "record", "-q", "-e", "io_uring:io_uring_submit_req", "-o", str(data), "--", *command],
        capture_output=True,
        text=True,
        env=env,
    )


def perf_uring(data: Path) -> Counter:
    """Requests per opcode name in a ``perf record`` of ``io_uring:io_uring_submit_req``."""
    script = subprocess.run(["perf", "script", "-i", str(data)], capture_output=True, text=True)
    found = Counter()
    for line in script.stdout.splitlines():
        m = re.search(r"opcode (\w+)", line)
        if m:
            found[m.group(1).upper()] += 1
    return found
