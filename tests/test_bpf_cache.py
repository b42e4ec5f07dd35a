"""The compiled BPF program kept per kernel (tracer.bpfcache, issue 35): relocation, entries, and records
that start from the cache against records that compile."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cli

from ckpt_trace import config
from ckpt_trace.tracer import bpfcache

INSN = struct.Struct("<BBhi")


def _code(*insns: tuple[int, int, int, int]) -> bytes:
    return b"".join(INSN.pack(*insn) for insn in insns)


def _entry(code: bytes) -> bpfcache.Entry:
    dtype = np.dtype({"names": ["ts_ns", "path"], "formats": ["<u8", ("u1", 16)], "offsets": [0, 8], "itemsize": 32})
    maps = (bpfcache.MapSpec("events", 27, 0, 0, 4096, 0), bpfcache.MapSpec("lost", 2, 4, 8, 8, 0))
    return bpfcache.Entry(maps, (("tracepoint__raw_syscalls__sys_enter", 5, code),), "GPL", {"events": dtype})


def test_map_references_become_indices_and_back():
    # r1 = map fd 7 (ld_imm64, two slots), r2 = 7 (a plain immediate: not a map), r1 = map fd 9, exit
    code = _code(
        (0x18, 0x11, 0, 7), (0, 0, 0, 0), (0xB7, 0x02, 0, 7), (0x18, 0x11, 0, 9), (0, 0, 0, 0), (0x95, 0, 0, 0)
    )
    kept = bpfcache.relocate(code, {7: 0, 9: 1})
    immediates = [INSN.unpack_from(kept, i)[3] for i in range(0, len(kept), 8)]
    assert immediates == [0, 0, 7, 1, 0, 0]
    assert bpfcache.relocate(kept, {0: 41, 1: 42}) == _code(
        (0x18, 0x11, 0, 41), (0, 0, 0, 0), (0xB7, 0x02, 0, 7), (0x18, 0x11, 0, 42), (0, 0, 0, 0), (0x95, 0, 0, 0)
    )
    with pytest.raises(bpfcache.NotCacheable, match="map fd 8"):
        bpfcache.relocate(_code((0x18, 0x11, 0, 8), (0, 0, 0, 0)), {7: 0})
    with pytest.raises(bpfcache.NotCacheable, match="pseudo source 2"):  # BPF_PSEUDO_MAP_VALUE: not relocated
        bpfcache.relocate(_code((0x18, 0x21, 0, 7), (0, 0, 0, 0)), {7: 0})
    with pytest.raises(bpfcache.NotCacheable, match="whole number"):
        bpfcache.relocate(code[:-3], {7: 0, 9: 1})


def test_an_entry_round_trips_and_a_damaged_one_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "cache"))
    entry = _entry(_code((0x18, 0x11, 0, 1), (0, 0, 0, 0), (0x95, 0, 0, 0)))
    assert bpfcache.load("program text") == (None, "miss")
    path = bpfcache.store("program text", entry)
    assert path is not None and path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0
    found, why = bpfcache.load("program text")
    assert why == "hit" and found == entry and found.dtypes["events"] == entry.dtypes["events"]
    assert bpfcache.load("another program text") == (None, "miss")  # the text is in the key

    raw = bytearray(path.read_bytes())
    raw[-10] ^= 1
    path.write_bytes(bytes(raw))
    assert bpfcache.load("program text") == (None, "corrupt (digest mismatch)")
    body = b'{"format": 1}'
    path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    assert bpfcache.load("program text") == (None, "corrupt (KeyError)")
    bpfcache.store("program text", entry)  # rewritten whole, over the damaged one
    assert bpfcache.load("program text")[1] == "hit"
    path.chmod(0o666)
    assert bpfcache.load("program text")[0] is None  # anyone may write it: its code would run in the kernel
    path.chmod(0o600)
    assert bpfcache.load("program text")[1] == "hit"


def test_writing_an_entry_removes_stale_ones_and_keeps_the_last_used(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(config, "BPF_CACHE_ENTRIES", 3)
    entry = _entry(_code((0x95, 0, 0, 0)))
    first = bpfcache.store("text 0", entry)
    assert first is not None
    directory = first.parent
    old_naming = directory / ("program-" + "a" * 40 + ".json")  # before entries named their machine
    recent_old_naming = directory / ("program-" + "d" * 40 + ".json")  # an older recorder may still use it
    other_kernel = directory / ("program-" + "0" * 16 + "-" + "b" * 40 + ".json")
    foreign = directory / ("program-" + "1" * 16 + "-" + "c" * 40 + ".json")
    unrelated = directory / "notes.txt"
    for path in (old_naming, recent_old_naming, other_kernel, foreign, unrelated):
        path.write_bytes(b"x")
    week_s = bpfcache.OLD_NAMING_S
    os.utime(old_naming, (os.path.getmtime(old_naming) - week_s - 60,) * 2)
    os.chown(foreign, 65534, 65534)  # another user's: never removed
    paths = [first] + [bpfcache.store(f"text {i}", entry) for i in (1, 2)]
    assert all(path is not None and path.exists() for path in paths)
    assert not old_naming.exists() and not other_kernel.exists()  # no start here can hit them
    assert foreign.exists() and unrelated.exists() and recent_old_naming.exists()
    for age, path in enumerate(paths):  # last used: text 2 long ago, text 0 most recently
        assert path is not None
        os.utime(path, ns=(10**18 - age * 10**12, 10**18 - age * 10**12))
    assert bpfcache.load("text 2")[1] == "hit"  # a hit makes it the most recently used
    newest = bpfcache.store("text 3", entry)
    kept = sorted(path.name for path in directory.glob(f"program-{bpfcache.machine_key()}-*.json"))
    assert kept == sorted(path.name for path in (paths[0], paths[2], newest) if path is not None)  # text 1 went
    assert bpfcache.load("text 1") == (None, "miss") and bpfcache.load("text 0")[1] == "hit"


def test_the_key_names_the_kernel_btf_and_cache_format(monkeypatch):
    key = bpfcache.cache_key("text")
    monkeypatch.setattr(bpfcache, "CACHE_FORMAT", bpfcache.CACHE_FORMAT + 1)
    assert bpfcache.cache_key("text") != key
    monkeypatch.undo()
    monkeypatch.setattr(bpfcache, "_btf_digest", lambda: "another BTF")
    assert bpfcache.cache_key("text") != key


def test_path_filters_become_the_programs_prefixes(monkeypatch):
    from ckpt_trace.tracer import bcc_backend

    assert bcc_backend.kernel_filters([]) == (bcc_backend.MODE_SPECIAL, [b"/proc/", b"/sys/", b"/dev/"])
    assert bcc_backend.kernel_filters(["/ckpt/", "/data/x"]) == (bcc_backend.MODE_FILTERS, [b"/ckpt/", b"/data/x"])
    many = [f"/d{i}/" for i in range(bcc_backend.MAX_KERNEL_FILTERS + 1)]
    assert bcc_backend.kernel_filters(many) == (bcc_backend.MODE_NONE, [])  # user space judges them alone
    assert bcc_backend.kernel_filters(["/" + "a" * config.BPF_PATH_BYTES])[0] == bcc_backend.MODE_NONE


WORKLOAD = r"""
import os, sys
out = sys.argv[1]
fd = os.open(f"{out}/a.bin.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"h" * 704)
os.write(fd, bytes(range(256)) * 64)
os.pwrite(fd, b"t" * 873, 100_000)
os.writev(fd, [b"x" * 10, b"y" * 4096])
os.lseek(fd, 4096, os.SEEK_SET)
os.write(fd, b"z" * 512)
os.fsync(fd)
os.close(fd)
os.rename(f"{out}/a.bin.tmp", f"{out}/a.bin")
fd = os.open(f"{out}/a.bin", os.O_RDONLY)
os.read(fd, 8192)
os.pread(fd, 1000, 50_000)
os.close(fd)
os.unlink(f"{out}/a.bin")
"""
TIMING = ["ts_ns", "dur_ns", "pid", "tid"]  # when, and which process: all that differs between two runs


def _record(tmp_path: Path, name: str, directory: str = "out"):
    """Record WORKLOAD into ``tmp_path/directory`` with it as --path-filter: (the rows but for TIMING, how the
    program started, the trace's metadata)."""
    from ckpt_trace.formats import read_trace

    out = tmp_path / directory
    out.mkdir(exist_ok=True)  # the workload leaves it empty
    trace = tmp_path / f"{name}.arrow"
    command = (sys.executable, "-c", WORKLOAD, str(out))
    proc = cli("record", "--backend", "bcc", "--json", "-o", str(trace), "--path-filter", f"{out}/", "--", *command)
    summary = json.loads(proc.stdout)
    read = read_trace(trace)
    metadata = dict(read.metadata)
    assert metadata["bpf_program"] == summary["bpf_program"] and summary["start_s"] > 0
    return read.table.drop_columns(TIMING), summary["bpf_program"], metadata


@pytest.mark.slow
def test_a_record_from_the_cache_writes_the_rows_a_compiled_one_writes(bcc_backend, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CKPT_TRACE_CACHE_DIR", str(cache))
    compiled, started, compiled_meta = _record(tmp_path, "compiled")
    assert started["source"] == "compiled" and started["cache"] == "miss; stored"
    assert compiled.num_rows >= 12 and compiled_meta["lost_events"] == 0
    (entry,) = (cache / "bpf").iterdir()

    cached, started, meta = _record(tmp_path, "cached")
    assert started == {"source": "cache", "cache": "hit", "load_s": started["load_s"]}
    assert meta["lost_events"] == 0
    assert cached.equals(compiled)
    sizes = [row["size"] for row in compiled.to_pylist() if row["op"] == "write"]
    assert sorted(sizes) == sorted([704, 16384, 873, 4106, 512])

    # a damaged entry: compiled again and rewritten
    raw = bytearray(entry.read_bytes())
    raw[len(raw) // 2] ^= 0x20
    entry.write_bytes(bytes(raw))
    again, started, _ = _record(tmp_path, "damaged")
    assert started["source"] == "compiled" and started["cache"] == "corrupt (digest mismatch); stored"
    assert again.num_rows == compiled.num_rows

    # an entry the kernel refuses (its digest right, its first program not a valid one): compiled again
    digest, _, body = entry.read_bytes().partition(b"\n")
    assert hashlib.sha256(body).hexdigest().encode() == digest  # the damaged entry was rewritten whole
    data = json.loads(body)
    data["functions"][0][2] = base64.b64encode(bytes.fromhex("ff00000000000000")).decode()  # no such opcode
    body = json.dumps(data, sort_keys=True).encode()
    entry.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    refused, started, _ = _record(tmp_path, "refused")
    assert started["source"] == "compiled" and started["cache"].startswith("refused (program ")
    assert started["cache"].endswith("; stored") and refused.num_rows == compiled.num_rows
    _, started, _ = _record(tmp_path, "hit")
    assert started["source"] == "cache"
    # another --path-filter: the filters are data, not code, so the same program serves it
    other, started, meta = _record(tmp_path, "other", "elsewhere")
    # what user space still had to filter out: a few rows, where the interpreter's start alone opens and maps
    # about two hundred files outside the filter: the kernel excluded them, by the new prefix
    assert started["source"] == "cache" and meta["filtered_rows"] < 20 and compiled_meta["filtered_rows"] < 20
    assert other.column("path").to_pylist() == [
        path.replace(f"{tmp_path}/out/", f"{tmp_path}/elsewhere/") for path in compiled.column("path").to_pylist()
    ]


@pytest.mark.slow
def test_the_cache_can_be_turned_off(bcc_backend, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_TRACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CKPT_TRACE_BPF_PROGRAM_CACHE", "0")
    _, started, _ = _record(tmp_path, "off")
    assert started["source"] == "compiled" and started["cache"] == "off (CKPT_TRACE_BPF_PROGRAM_CACHE=0)"
    assert not (tmp_path / "cache" / "bpf").exists()


def test_the_probes_detach_at_once_and_the_maps_stay_readable(bcc_backend, tmp_path, monkeypatch):
    """``detach_soon`` (called when the command has exited) hands every probe's attachment to a child
    process whose exit waits out the RCU grace periods, so neither the trace's writing nor this process's
    exit waits for them; this process's descriptors are closed at once and the rings and counters stay
    readable."""
    import threading

    from ckpt_trace.tracer import bpfcache
    from ckpt_trace.tracer.bcc_backend import BccTracer

    monkeypatch.setenv("CKPT_TRACE_CACHE_DIR", str(tmp_path / "cache"))
    BccTracer().load()  # compiled and cached, or already cached
    tracer = BccTracer()
    tracer.load()
    holder = tracer.program.holder
    assert isinstance(holder, bpfcache.Attached) and tracer.program.started["source"] == "cache"
    links = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in holder.link_fds}
    assert len(links) >= 4 and all(target.startswith("anon_inode:") for target in links.values())
    tracer.program.detach_soon()
    for fd, target in links.items():  # closed here already, before the child's exit is through
        assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}") != target
    reapers = [t for t in threading.enumerate() if t.name == "ckpt-trace-detach"]
    assert len(reapers) == 1  # one thread reaps the children (threads close them only where none can start)
    for thread in reapers:
        thread.join(timeout=60)
    for fd, target in links.items():  # closed (a number reused since would name another file)
        assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}") != target
    assert holder.link_fds == [] and bpfcache.lookup_u64(tracer.program.map_fds["lost"], 0) == 0
    holder.close()


SPELLINGS = r"""
import os, sys
top = sys.argv[1]
paths = [f"{top}//in/f", f"{top}/./in/f"]
for k in range(1, 10):  # the component's length moves each pattern across the program's 8-byte words
    pad = "p" * k
    paths += [f"{top}/{pad}/../in/f", f"{top}/{pad}//../in/f", f"{top}/{pad}/./../in/f", f"{top}/{pad}/x/../../in/f"]
if sys.argv[2] == "special":  # raw under /dev/ or /proc/, normalised elsewhere
    paths += [f"/dev/..{top}/in/f", f"/proc/./..{top}/in/f", f"/dev/shm/../..{top}/in/f"]
for path in paths:
    os.close(os.open(path, os.O_RDONLY))
for _ in range(20):  # plain and outside the filter: the kernel drops these, user space never sees them
    for k in range(1, 10):
        os.close(os.open(f"{top}/{'p' * k}/g", os.O_RDONLY))
"""


@pytest.mark.parametrize("mode", ["filters", "special"])
def test_the_kernel_drops_a_path_only_where_its_spelling_is_plain(bcc_backend, tmp_path, mode):
    """The BPF program judges a path by its raw string, so it drops only an absolute path with no empty, "." or
    ".." component (``plain_absolute``, on 8-byte words); every other spelling reaches user space, which
    judges the normalised path. Each open below names the one file under the filter through such a component,
    at each byte of a word; none may be missing."""
    from ckpt_trace.formats import read_trace

    top = tmp_path / "t"
    (top / "in").mkdir(parents=True)
    (top / "in" / "f").write_bytes(b"f")
    for k in range(1, 10):
        (top / ("p" * k) / "x").mkdir(parents=True)
        (top / ("p" * k) / "g").write_bytes(b"g")
    trace = tmp_path / "trace.arrow"
    command = (sys.executable, "-c", SPELLINGS, str(top), mode)
    filters = ("--path-filter", f"{top}/in/") if mode == "filters" else ()
    proc = cli("record", "--backend", "bcc", "--json", "-o", str(trace), *filters, "--", *command)
    assert json.loads(proc.stdout)["lost_events"] == 0
    read = read_trace(trace)
    rows = read.table.select(["op", "path"]).to_pylist()
    in_filter = [row for row in rows if row["op"] == "open" and row["path"] == f"{top}/in/f"]
    expected = 2 + 4 * 9 + (3 if mode == "special" else 0)
    assert len(in_filter) == expected
    if mode == "filters":  # the 180 plain opens outside it (and their closes) never reached user space
        assert int(read.metadata["filtered_rows"]) < 100
        assert not any(row["path"] and row["path"].endswith("/g") for row in rows)
