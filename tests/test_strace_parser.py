"""The strace log parser on lines strace 6 prints with -xx -X raw."""

from __future__ import annotations

from ckpt_trace.tracer.strace_backend import _events_from_lines, parse_args

LOG = r"""
100  1700000000.000000100 execve("\x2f\x62\x69\x6e\x2f\x74", ["\x74"], ["\x52\x41\x4e\x4b\x3d\x35"]) = 0 <0.000100000>
100  1700000000.000000200 openat(-100, "\x2f\x64\x2f\x61", 0x80241, 0644) = 3 <0.000004000>
100  1700000000.000000300 writev(3, [{iov_base="\x61"..., iov_len=700}, {iov_base="\x62", iov_len=1}], 2) = 701 <0.000003000>
100  1700000000.000000400 clone(child_stack=NULL, flags=0x1200000|17, child_tidptr=0x7f <unfinished ...>
101  1700000000.000000500 write(0x3, 0x7f00, 0x10) = 0x10 <0.000001000>
100  1700000000.000000450 <... clone resumed>) = 101 <0.000200000>
100  1700000000.000000600 openat(-100, "\x2f\x6e\x6f\x70\x65", 0) = -1 ENOENT (No such file or directory) <0.000001000>
100  1700000000.000000700 clone3({flags=0x3d0f00, exit_signal=0} => {parent_tid=[102]}, 88) = 102 <0.000001000>
100  1700000000.000000800 pwritev2(3, [{iov_base="\x63", iov_len=4096}], 1, 8192, 0x10) = 4096 <0.000001000>
100  1700000000.000000900 exit_group(0)     = ?
101  1700000000.000001000 +++ exited with 0 +++
"""


def test_parses_calls_errors_unfinished_and_structs():
    events = list(_events_from_lines(iter(LOG.splitlines())))
    by_name = {}
    for event in events:
        by_name.setdefault(event.name, event)
    assert by_name["execve"].rank == 5 and by_name["execve"].args["path"] == "/bin/t"
    assert by_name["openat"].args == {"dirfd": -100, "path": "/d/a", "flags": 0x80241, "mode": 0o644}
    assert by_name["writev"].size == 701 and by_name["writev"].args["iov_count"] == 2
    assert by_name["clone"].ret == 101 and by_name["clone"].ts_ns == 1700000000000000400
    assert by_name["clone"].args["clone_flags"] == 0x1200011
    assert by_name["clone3"].args["clone_flags"] == 0x3D0F00 and by_name["clone3"].ret == 102
    assert by_name["write"].args == {"fd": 3, "count": 16} and by_name["write"].ret == 16
    assert by_name["pwritev2"].args["offset"] == 8192 and by_name["pwritev2"].args["rwflags"] == 0x10
    failed = [e for e in events if e.ret < 0]
    assert len(failed) == 1 and failed[0].ret == -2
    assert "exit_group" not in by_name


def test_nested_values_and_comments():
    values, named = parse_args('3, {a=1, b=[2, 3]}, 0x7ffd /* 35 vars */, NULL, "\\x41\\x42"...')
    assert values == [3, {"a": 1, "b": [2, 3]}, 0x7FFD, 0, "AB"]
    assert named == {}
