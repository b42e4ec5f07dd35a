"""TraceBuilder on synthetic events: the kernel's descriptor and position rules."""

from __future__ import annotations

from ckpt_trace.tracer import syscalls as sc
from ckpt_trace.tracer.state import SyscallEvent, TraceBuilder, rank_from_environ

PID = 100


class Feed:
    def __init__(self, **kwargs):
        self.builder = TraceBuilder(start_ns=0, root_pid=PID, cwd="/work", **kwargs)
        self.ts = 0

    def __call__(self, name, ret, tid=PID, **args):
        self.ts += 10
        self.builder.feed(SyscallEvent(ts_ns=self.ts, dur_ns=1, tid=tid, name=name, args=args, ret=ret))

    def rows(self):
        cols = self.builder.columns()
        return [dict(zip(cols, values)) for values in zip(*cols.values())]

    def writes(self):
        return [
            (r["tid"], r["path"], r["offset"], r["offset_source"], r["ret"]) for r in self.rows() if r["op"] == "write"
        ]


def test_relative_paths_resolve_against_cwd_and_dirfd():
    f = Feed()
    f("openat", 3, dirfd=sc.AT_FDCWD, path="ckpt/../a.bin", flags=sc.O_WRONLY | sc.O_CREAT)
    f("openat", 4, dirfd=sc.AT_FDCWD, path="/data//x/", flags=sc.O_RDONLY | 0o200000)
    f("openat", 5, dirfd=4, path="y.bin", flags=sc.O_WRONLY | sc.O_CREAT)
    f("chdir", 0, path="/elsewhere")
    f("open", 6, path="z.bin", flags=sc.O_RDONLY)
    assert [r["path"] for r in f.rows()] == ["/work/a.bin", "/data/x", "/data/x/y.bin", "/elsewhere/z.bin"]


def test_dup_shares_the_position_and_lseek_sets_it():
    f = Feed()
    f("openat", 3, dirfd=sc.AT_FDCWD, path="/f", flags=sc.O_WRONLY | sc.O_CREAT | sc.O_TRUNC)
    f("write", 100, fd=3, count=100)
    f("dup", 4, fd=3)
    f("write", 50, fd=4, count=50)
    f("lseek", 7, fd=3, offset=7, whence=sc.SEEK_SET)
    f("writev", 10, fd=4, iov_count=2)
    f("pwrite64", 5, fd=3, count=5, offset=1000)
    f("write", 1, fd=3, count=1)
    assert [w[2] for w in f.writes()] == [0, 100, 7, 1000, 17]
    assert [w[3] for w in f.writes()] == ["position", "position", "position", "explicit", "position"]


def test_fork_copies_the_table_but_shares_descriptions():
    f = Feed()
    f("openat", 3, dirfd=sc.AT_FDCWD, path="/f", flags=sc.O_WRONLY | sc.O_CREAT | sc.O_TRUNC)
    f("clone", 200, clone_flags=17)
    f("write", 30, tid=200, fd=3, count=30)
    f("close", 0, tid=200, fd=3)
    f("write", 5, fd=3, count=5)
    f("write", 1, tid=200, fd=3, count=1)  # closed in the child: not tracked
    assert [(w[0], w[2]) for w in f.writes()] == [(200, 0), (PID, 30)]
    assert f.builder.untracked_fd_ops == 1
    assert {r["pid"] for r in f.rows() if r["tid"] == 200} == {200}


def test_threads_share_the_table_and_report_the_group_pid():
    f = Feed()
    f("clone", 101, clone_flags=sc.CLONE_THREAD | sc.CLONE_FILES)
    f("openat", 3, tid=101, dirfd=sc.AT_FDCWD, path="/f", flags=sc.O_WRONLY | sc.O_CREAT | sc.O_TRUNC)
    f("write", 9, fd=3, count=9)
    assert [(r["pid"], r["tid"]) for r in f.rows()] == [(PID, 101), (PID, PID)]


def test_append_offsets_follow_the_tracked_size_or_say_unknown():
    f = Feed()
    f("openat", 3, dirfd=sc.AT_FDCWD, path="/log", flags=sc.O_WRONLY | sc.O_CREAT | sc.O_TRUNC | sc.O_APPEND)
    f("write", 10, fd=3, count=10)
    f("lseek", 0, fd=3, offset=0, whence=sc.SEEK_SET)
    f("write", 4, fd=3, count=4)
    f("openat", 4, dirfd=sc.AT_FDCWD, path="/old", flags=sc.O_WRONLY | sc.O_APPEND)
    f("write", 4, fd=4, count=4)
    f("fcntl", 0, fd=3, cmd=sc.F_SETFL, arg=0)
    f("lseek", 2, fd=3, offset=2, whence=sc.SEEK_SET)
    f("write", 3, fd=3, count=3)
    assert [(w[1], w[2], w[3]) for w in f.writes()] == [
        ("/log", 0, "append"),
        ("/log", 10, "append"),
        ("/old", None, "unknown"),
        ("/log", 2, "position"),
    ]


def test_lseek_to_end_teaches_the_size():
    f = Feed()
    f("openat", 3, dirfd=sc.AT_FDCWD, path="/old", flags=sc.O_RDWR | sc.O_APPEND)
    f("lseek", 5000, fd=3, offset=0, whence=sc.SEEK_END)
    f("write", 10, fd=3, count=10)
    assert f.writes()[0][2:4] == (5000, "append")


def test_exec_closes_cloexec_descriptors_only():
    f = Feed()
    f("openat", 3, dirfd=sc.AT_FDCWD, path="/keep", flags=sc.O_WRONLY | sc.O_CREAT)
    f("openat", 4, dirfd=sc.AT_FDCWD, path="/drop", flags=sc.O_WRONLY | sc.O_CREAT | sc.O_CLOEXEC)
    f("openat", 5, dirfd=sc.AT_FDCWD, path="/inherit", flags=sc.O_WRONLY | sc.O_CREAT | sc.O_CLOEXEC)
    f("ioctl", 0, fd=5, cmd=sc.FIONCLEX, arg=0)
    f("execve", 0, path="/usr/bin/tool")
    for fd in (3, 4, 5):
        f("write", 1, fd=fd, count=1)
    assert [w[1] for w in f.writes()] == ["/keep", "/inherit"]
    assert f.rows()[-1]["comm"] == "tool"


def test_rename_moves_open_descriptors_and_sizes():
    f = Feed()
    f("openat", 3, dirfd=sc.AT_FDCWD, path="/d/x.tmp", flags=sc.O_WRONLY | sc.O_CREAT | sc.O_TRUNC | sc.O_APPEND)
    f("write", 8, fd=3, count=8)
    f("rename", 0, path="/d/x.tmp", path2="/d/x")
    f("write", 2, fd=3, count=2)
    renames = [(r["path"], r["new_path"]) for r in f.rows() if r["op"] == "rename"]
    assert renames == [("/d/x.tmp", "/d/x")]
    assert f.writes()[-1][1:3] == ("/d/x", 8)


def test_filters_drop_special_and_unmatched_paths():
    f = Feed(path_filters=["/data/"])
    f("openat", 3, dirfd=sc.AT_FDCWD, path="/proc/self/status", flags=0)
    f("openat", 4, dirfd=sc.AT_FDCWD, path="/data/a", flags=0)
    f("openat", 5, dirfd=sc.AT_FDCWD, path="/datax", flags=0)
    f("io_uring_setup", 6, entries=8)
    assert [r["path"] for r in f.rows()] == ["/data/a", "anon_inode:[io_uring]"]
    assert f.builder.filtered_ops == 2


def test_rank_comes_from_the_launchers_variables():
    assert rank_from_environ(["PATH=/bin", "RANK=3"]) == 3
    assert rank_from_environ(["OMPI_COMM_WORLD_RANK=7"]) == 7
    assert rank_from_environ(["SLURM_PROCID=2", "RANK=x"]) == 2
    assert rank_from_environ(["HOME=/root"]) is None


def ev(ts, dur, tid, name, ret, **args) -> SyscallEvent:
    """One system call as a backend reports it: entered at ``ts`` ns, ``dur`` ns long, by thread ``tid``."""
    return SyscallEvent(ts_ns=ts, dur_ns=dur, tid=tid, name=name, args=args, ret=ret)


def test_a_descriptor_reused_across_threads_follows_the_exit_order():
    # Thread 101 enters openat before thread 100 closes fd 6, and gets the freed number 6 back.
    b = TraceBuilder(start_ns=0, root_pid=PID, cwd="/")

    b.feed_all(
        [
            ev(0, 5, PID, "clone", 101, clone_flags=sc.CLONE_THREAD | sc.CLONE_FILES),
            ev(10, 1, PID, "openat", 6, dirfd=sc.AT_FDCWD, path="/a", flags=sc.O_RDONLY),
            ev(20, 30, 101, "openat", 6, dirfd=sc.AT_FDCWD, path="/b", flags=sc.O_WRONLY | sc.O_CREAT),
            ev(25, 2, PID, "close", 0, fd=6),
            ev(60, 1, 101, "write", 4, fd=6, count=4),
            ev(70, 1, 101, "close", 0, fd=6),
        ]
    )
    cols = b.columns()
    assert list(zip(cols["op"], cols["path"])) == [
        ("open", "/a"),
        ("close", "/a"),
        ("open", "/b"),
        ("write", "/b"),
        ("close", "/b"),
    ]
    assert b.untracked_fd_ops == 0


def test_a_close_that_returns_after_another_threads_open_of_the_same_number():
    # close(6) enters first and frees 6; thread 101's openat returns 6 while the close is still flushing.
    b = TraceBuilder(start_ns=0, root_pid=PID, cwd="/")

    b.feed_all(
        [
            ev(0, 5, PID, "clone", 101, clone_flags=sc.CLONE_THREAD | sc.CLONE_FILES),
            ev(10, 1, PID, "openat", 6, dirfd=sc.AT_FDCWD, path="/a", flags=sc.O_WRONLY | sc.O_CREAT),
            ev(20, 50, PID, "close", 0, fd=6),
            ev(30, 5, 101, "openat", 6, dirfd=sc.AT_FDCWD, path="/b", flags=sc.O_WRONLY | sc.O_CREAT),
            ev(40, 1, 101, "pwrite64", 4, fd=6, count=4, offset=300),
        ]
    )
    cols = b.columns()
    assert list(zip(cols["op"], cols["path"])) == [("open", "/a"), ("close", "/a"), ("open", "/b"), ("write", "/b")]
    assert b.untracked_fd_ops == 0


def test_the_feeder_puts_chunks_in_effect_order_and_counts_what_comes_too_late():
    """Events in exit order (as a BPF ring or strace log gives them), in chunks of two, through the feeder:
    the rows of one sorted feed; a close whose entry lies further back than the slack is counted late."""
    from ckpt_trace.tracer.state import EffectOrderFeeder, effect_ns

    events = [
        ev(0, 5, PID, "clone", 101, clone_flags=sc.CLONE_THREAD | sc.CLONE_FILES),
        ev(10, 1, PID, "openat", 6, dirfd=sc.AT_FDCWD, path="/a", flags=sc.O_WRONLY | sc.O_CREAT),
        ev(30, 5, 101, "openat", 6, dirfd=sc.AT_FDCWD, path="/b", flags=sc.O_WRONLY | sc.O_CREAT),
        ev(40, 1, 101, "pwrite64", 4, fd=6, count=4, offset=300),
        ev(20, 50, PID, "close", 0, fd=6),  # entered at 20, arrives at its exit (70), after 101's calls
        ev(80, 1, 101, "close", 0, fd=6),
    ]
    whole = TraceBuilder(start_ns=0, root_pid=PID, cwd="/")
    whole.feed_all(events)
    taken = []
    chunked = TraceBuilder(start_ns=0, root_pid=PID, cwd="/")
    feeder = EffectOrderFeeder(chunked, slack_ns=60, on_rows=lambda b: taken.append(b.take_rows()), release_every=1)
    for i in range(0, len(events), 2):
        feeder.add(events[i : i + 2])
    feeder.finish()
    rows = {name: [v for part in taken for v in part[name]] for name in whole.columns()}
    assert rows == whole.columns() and feeder.late_events == 0 and len(taken) > 2
    assert [effect_ns(e) for e in events] == [0, 11, 35, 41, 20, 80]  # a close takes effect at entry

    short = EffectOrderFeeder(TraceBuilder(start_ns=0, root_pid=PID, cwd="/"), slack_ns=5, release_every=1)
    for i in range(0, len(events), 2):
        short.add(events[i : i + 2])
    short.finish()
    assert short.late_events == 1  # the close: 15 ns behind what was fed already, more than the 5 ns slack


def test_bcc_records_decode_per_call_with_c_types_and_stale_string_tails():
    """The bcc decoder (grouped by syscall, numpy columns) on hand-made ``event_t`` records: registers as the
    prototypes type them (s32 descriptors, u32 flags), strings cut at their first NUL whatever follows,
    the extra fields, records in the chunk's order."""
    import numpy as np

    from ckpt_trace.tracer import bcc_backend

    dtype = np.dtype(
        [
            ("ts_ns", "<u8"),
            ("dur_ns", "<u8"),
            ("pid", "<u4"),
            ("tid", "<u4"),
            ("nr", "<i4"),
            ("truncated", "<u4"),
            ("ignore", "<u4"),
            ("creates", "<u4"),
            ("ret", "<i8"),
            ("a", "<i8", (6,)),
            ("size", "<i8"),
            ("extra", "<i8"),
            ("ino", "<u8"),
            ("dev", "<u4"),
            ("nfds", "<u4"),
            ("comm", "u1", (16,)),
            ("path", "u1", (256,)),
            ("path2", "u1", (256,)),
        ]
    )
    names = bcc_backend._NAMES
    records = np.zeros(5, dtype)

    def put(i, name, regs, ret, path=b"", comm=b"python3", size=-1, extra=0, ino=0):
        records[i]["ts_ns"], records[i]["dur_ns"], records[i]["pid"], records[i]["tid"] = 100 + i, 5, 7, 8 + i
        records[i]["nr"], records[i]["ret"], records[i]["size"], records[i]["extra"] = (
            names.index(name),
            ret,
            size,
            extra,
        )
        records[i]["a"][: len(regs)] = regs
        records[i]["ino"], records[i]["dev"] = ino, 3 if ino else 0
        records[i]["path"][: len(path)] = np.frombuffer(path, np.uint8)
        records[i]["comm"][: len(comm)] = np.frombuffer(comm, np.uint8)

    flags = sc.O_WRONLY | sc.O_CREAT | sc.O_CLOEXEC
    put(0, "openat", [sc.AT_FDCWD & 0xFFFFFFFF, 0, flags | (0xABCD << 32), 0o644], 3, path=b"/ckpt/a.bin\0stale")
    put(1, "write", [3, 0x7F00DEAD, 4096], 4096)
    put(2, "openat", [-1 << 32 | 5, 0, sc.O_RDONLY, 0], 4, path=b"/ckpt/a.bin\0other", comm=b"pt_main_thread")
    put(3, "mmap", [0, 8192, 1, 1, 4, 0], 0x7F0000000000, ino=42)
    put(4, "openat2", [sc.AT_FDCWD, 0, 0, 24], 5, path=b"/ckpt/b.bin", extra=sc.O_RDONLY)
    events = bcc_backend.decode_events(records, {})
    assert [e.name for e in events] == ["openat", "write", "openat", "mmap", "openat2"]
    assert events[0].args == {"dirfd": sc.AT_FDCWD, "path": "/ckpt/a.bin", "flags": flags, "mode": 0o644}
    assert events[1].args == {"fd": 3, "count": 4096} and events[1].size is None and events[1].ret == 4096
    assert events[2].args["dirfd"] == 5 and events[2].args["path"] == "/ckpt/a.bin"
    assert [e.comm for e in events[:3]] == ["python3", "python3", "pt_main_thread"]
    assert events[3].args["ino"] == 42 and events[3].args["dev"] == 3 and events[3].args["fd"] == 4
    assert events[4].args["flags"] == sc.O_RDONLY and events[4].args["path"] == "/ckpt/b.bin"
    assert [(e.ts_ns, e.tid, e.pid) for e in events] == [(100 + i, 8 + i, 7) for i in range(5)]


def test_append_row_takes_the_optional_columns_in_their_order():
    """``_append_row``'s positional values after ``interface`` are ``_OPTIONAL_COLUMNS`` in order: a handler
    calling it directly and the column lists agree on every column."""
    import inspect

    from ckpt_trace.tracer import state

    names = list(inspect.signature(TraceBuilder._append_row).parameters)
    assert tuple(names[names.index("interface") + 1 :]) == state._OPTIONAL_COLUMNS


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_STEPS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 60), st.integers(1, 40), st.integers(0, 3), st.integers(0, 7)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_STEPS, st.integers(0, 100), st.integers(1, 50), st.sampled_from([8, 64 << 20]))
def test_mappings_find_what_a_pass_over_a_list_finds(steps, address, length, long_bytes):
    """``Mappings`` (bisect on start addresses, the longest length, a table by inode) answers as the pass over
    a plain list it replaced, in the same order: overlapping ranges, the first start at an address, an inode's
    mappings, after any mix of adds and removals (overlapping and equal mappings included)."""
    from ckpt_trace.tracer.state import Mapping, Mappings

    held, plain = Mappings(long_bytes), []  # mappings longer than it are kept apart: both ways are tried
    for add, start, size, ino, pick in steps:
        if add or not plain:
            mapping = Mapping(start, size, f"/f{ino}", 0, 1, 1, ino, 0)
            held.append(mapping)
            plain.append(mapping)
        else:
            gone = plain.pop(pick % len(plain))
            held.remove(gone)
    end = address + length
    assert [id(m) for m in held.overlapping(address, length)] == [
        id(m) for m in plain if m.address < end and address < m.address + m.length
    ]
    first = next((m for m in plain if m.address == address), None)
    assert held.starting_at(address) is first
    for ino in range(4):
        assert [id(m) for m in held.of_inode(ino)] == [id(m) for m in plain if m.ino == ino]
    assert [id(m) for m in held] == [id(m) for m in plain] and len(held) == len(plain)


def test_a_moved_mapping_keeps_its_place_in_the_order_of_addition():
    """``Mappings.move`` (mremap) refiles a mapping at its new range and keeps it where a list whose item
    changed would: before the mappings added after it, at the new address and no longer at the old one."""
    from ckpt_trace.tracer.state import Mapping, Mappings

    first, second, third = (Mapping(a, 4096, f"/f{a}", 0, 1, 1, a, 0) for a in (0x1000, 0x3000, 0x5000))
    held = Mappings()
    for mapping in (first, second, third):
        held.append(mapping)
    held.move(first, 0x9000, 8192)
    assert (first.address, first.length) == (0x9000, 8192)
    assert list(held) == [first, second, third]
    assert held.overlapping(0, 1 << 20) == [first, second, third]
    assert held.starting_at(0x9000) is first and held.starting_at(0x1000) is None
    assert held.overlapping(0x1000, 4096) == []
