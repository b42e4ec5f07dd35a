"""Directory entries as first-class (``replayer.entries``): a directory-rename commit, files renamed across
directories, lock files, trees removed and renameat2's flags replay to the recorded tree under every
strategy."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import record
from helpers.traces import CREATE, make_trace

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_posix_plan, replay
from ckpt_trace.replayer.entries import RENAME_EXCHANGE, RENAME_NOREPLACE
from ckpt_trace.replayer.replay import STRATEGIES

# Orbax's commit and its neighbours: each step is written by three threads into step_N.orbax-checkpoint-tmp/
# (a tree), a lock file is taken with O_CREAT|O_EXCL, the metadata is written beside and renamed across
# directories into the step, the step directory is renamed to its final name and the lock released; then
# the older step is removed with shutil.rmtree and a new directory takes its name.
PROGRAM = textwrap.dedent("""
    import os, sys, shutil, threading
    root = sys.argv[1]
    def save(step, size):
        tmp = os.path.join(root, f"step_{step}.orbax-checkpoint-tmp")
        os.makedirs(os.path.join(tmp, "state", "shards"))
        def shard(i):
            with open(os.path.join(tmp, "state", "shards", f"s{i}.bin"), "wb") as f:
                f.write(bytes([i]) * (size + i))
        ts = [threading.Thread(target=shard, args=(i,)) for i in range(3)]
        [t.start() for t in ts]; [t.join() for t in ts]
        lock = os.path.join(root, "commit.lock")
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); os.write(fd, b"1234"); os.close(fd)
        meta = os.path.join(root, "tmp", f"meta.{step}")
        os.makedirs(os.path.dirname(meta), exist_ok=True)
        with open(meta, "w") as f:
            f.write("m" * (100 + step))
        os.rename(meta, os.path.join(tmp, "_METADATA"))
        os.rename(tmp, os.path.join(root, f"step_{step}"))
        os.unlink(lock)
    save(1, 50000)
    save(2, 70000)
    shutil.rmtree(os.path.join(root, "step_1"))
    os.makedirs(os.path.join(root, "step_1"))
    with open(os.path.join(root, "step_1", "x"), "wb") as f:
        f.write(b"x" * 10)
""")


def tree(root: Path) -> dict[str, int | str | None]:
    """Every entry below ``root``: a file's size, None for a directory, "-> content" for a symbolic link
    (never followed)."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            else:
                out[rel] = None if path.is_dir() else path.lstat().st_size
    return dict(sorted(out.items()))


def record_commit(backend: str, tmp_path: Path, path_filter: str | None = None) -> tuple[Path, Path]:
    out = tmp_path / f"ck-{backend}"
    out.mkdir()
    program = tmp_path / "commit.py"
    program.write_text(PROGRAM)
    trace = tmp_path / f"{backend}.arrow"
    record(backend, trace, path_filter or str(out), sys.executable, str(program), str(out))
    return trace, out


def assert_replays_to(trace: Path, out: Path, tmp_path: Path, runs: int = 3) -> None:
    recorded = tree(out)
    for run in range(runs):
        target = tmp_path / f"replay-{out.name}-{run}"
        report = replay(trace, target=target, strategy="all", strip_prefix=str(out), verify=True)
        assert not report.size_mismatches
        for strategy in STRATEGIES:
            assert tree(target / strategy) == recorded, (run, strategy)
        report.release()


@pytest.mark.parametrize("backend_name", ["strace", "bcc"])
def test_a_directory_rename_commit_replays_to_the_recorded_tree(backend_name, request, tmp_path, io_uring):
    backend = request.getfixturevalue(f"{backend_name}_backend")
    trace, out = record_commit(backend, tmp_path)
    assert tree(out) == {
        "step_1": None,
        "step_1/x": 10,
        "step_2": None,
        "step_2/_METADATA": 102,
        "step_2/state": None,
        "step_2/state/shards": None,
        "step_2/state/shards/s0.bin": 70000,
        "step_2/state/shards/s1.bin": 70001,
        "step_2/state/shards/s2.bin": 70002,
        "tmp": None,
    }
    plan = build_posix_plan(read_trace(trace).table, strip_prefix=str(out))
    assert not any(d.startswith(("step_", "tmp")) for d in plan.precreate_dirs)  # all made by the trace
    assert not plan.precreate_files
    assert_replays_to(trace, out, tmp_path)


def test_a_directory_rename_waits_for_other_threads_work_inside_it(tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "mkdir", "path": "/c/s.tmp"},
            {"op": "open", "path": "/c/s.tmp/a", "fd": 3, "flags": CREATE, "ret": 3, "tid": 2},
            {"op": "write", "path": "/c/s.tmp/a", "fd": 3, "offset": 0, "size": 5, "ret": 5, "tid": 2},
            {"op": "close", "path": "/c/s.tmp/a", "fd": 3, "tid": 2},
            {"op": "rename", "path": "/c/s.tmp", "new_path": "/c/s"},
            {"op": "open", "path": "/c/s/a", "fd": 3, "flags": os.O_RDONLY, "ret": 3, "tid": 3},
            {"op": "read", "path": "/c/s/a", "fd": 3, "offset": 0, "size": 5, "ret": 5, "tid": 3},
        ],
    )
    plan = build_posix_plan(read_trace(trace).table)
    ops = {(op.kind, op.path): op for w in plan.workers for op in w.ops}
    assert ops[("rename", "c/s.tmp")].deps == (3,)  # the other thread's close of its file inside (after its open)
    assert ops[("open", "c/s/a")].deps == (4,)  # the reader waits for the rename
    assert plan.precreate_files == () and plan.precreate_dirs == ("c",)
    assert dict(plan.checks.expected_sizes) == {"c/s/a": 5}


@pytest.mark.slow
def test_renameat2_exchange_and_noreplace(tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "mkdir", "path": "/c/a"},
            {"op": "open", "path": "/c/a/f", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": "/c/a/f", "fd": 3, "offset": 0, "size": 7, "ret": 7},
            {"op": "close", "path": "/c/a/f", "fd": 3},
            {"op": "open", "path": "/c/b", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": "/c/b", "fd": 3, "offset": 0, "size": 3, "ret": 3},
            {"op": "close", "path": "/c/b", "fd": 3},
            {"op": "rename", "path": "/c/a", "new_path": "/c/b", "flags": RENAME_EXCHANGE},  # a file and a dir swap
            {"op": "rename", "path": "/c/a", "new_path": "/c/z", "flags": RENAME_NOREPLACE},
        ],
    )
    plan = build_posix_plan(read_trace(trace).table)
    assert dict(plan.checks.expected_sizes) == {"c/b/f": 7, "c/z": 3}
    for strategy in ("posix", "uring-buffered"):
        target = tmp_path / f"r-{strategy}"
        report = replay(trace, target=target, strategy=strategy, verify=True)
        assert not report.size_mismatches
        assert tree(target) == {"c": None, "c/b": None, "c/b/f": 7, "c/z": 3}


@pytest.mark.slow
def test_a_rename_onto_an_entry_the_replay_must_not_replace_fails_as_recorded(tmp_path):
    """RENAME_NOREPLACE is kept: where the target already holds the destination (a file the plan made before
    the clock), the replay fails rather than replace it."""
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "open", "path": "/c/keep", "fd": 3, "flags": os.O_RDONLY, "ret": 3},
            {"op": "read", "path": "/c/keep", "fd": 3, "offset": 0, "size": 4, "ret": 4},
            {"op": "close", "path": "/c/keep", "fd": 3},
            {"op": "open", "path": "/c/new", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "close", "path": "/c/new", "fd": 3},
            {"op": "rename", "path": "/c/new", "new_path": "/c/keep", "flags": RENAME_NOREPLACE},
        ],
    )
    with pytest.raises(Exception, match="File exists"):
        replay(trace, target=tmp_path / "r", strategy="posix")


# Written outside the filter, renamed into it: a step directory made under tmp/ and renamed into ckpts/, a file
# renamed through two temporary names, metadata written in staging/ and renamed into the step; a scratch file
# never renamed in. Each write the program makes is logged by the program itself (path at the time, bytes).
RENAMED_IN = textwrap.dedent("""
    import json, os, sys
    root = sys.argv[1]
    log = []
    def write(path, data):
        with open(path, "wb") as f:
            f.write(data)
        log.append((path, len(data)))
    for d in ("tmp/step_1.tmp/shards", "staging", "ckpts"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for i in range(3):
        write(os.path.join(root, "tmp/step_1.tmp/shards", f"s{i}"), bytes([i]) * (30000 + i))
    write(os.path.join(root, "staging/meta"), b"m" * 123)
    os.rename(os.path.join(root, "staging/meta"), os.path.join(root, "tmp/step_1.tmp/_METADATA"))
    os.rename(os.path.join(root, "tmp/step_1.tmp"), os.path.join(root, "ckpts/step_1"))
    write(os.path.join(root, "a.tmp"), b"a" * 777)
    os.rename(os.path.join(root, "a.tmp"), os.path.join(root, "b.tmp"))
    os.rename(os.path.join(root, "b.tmp"), os.path.join(root, "ckpts/latest.txt"))
    write(os.path.join(root, "scratch.bin"), b"s" * 55)
    json.dump(log, open(sys.argv[2], "w"))
""")


def _strace_writes(log: Path, root: Path) -> list[tuple[str, int]]:
    """(path, bytes) of each successful write(2) under ``root`` in strace's own log (-y prints paths)."""
    import re

    found = []
    for line in log.read_text().splitlines():
        m = re.search(r"\b(?:write|pwrite64)\((\d+)<([^>]*)>, .*\) = (\d+)$", line)
        if m and m.group(2).startswith(str(root) + "/"):
            found.append((m.group(2), int(m.group(3))))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["strace", "bcc"])
def test_path_filter_keeps_a_file_renamed_into_it(backend_name, request, tmp_path, io_uring):
    from collections import Counter

    backend = request.getfixturevalue(f"{backend_name}_backend")
    root = tmp_path / "run"
    root.mkdir()
    program = tmp_path / "renamed_in.py"
    program.write_text(RENAMED_IN)
    trace, own_log, strace_log = tmp_path / "t.arrow", tmp_path / "writes.json", tmp_path / "strace.log"
    command = [sys.executable, str(program), str(root), str(own_log)]
    if backend == "bcc":  # strace's own log of the same run, as the reference
        command = ["strace", "-f", "-y", "-qq", "-e", "trace=write,pwrite64", "-o", str(strace_log), *command]
    record(backend, trace, root / "ckpts", *command)
    import json

    written = [(p, n) for p, n in json.loads(own_log.read_text()) if not p.endswith("scratch.bin")]
    if backend == "bcc":
        assert Counter(p for p in _strace_writes(strace_log, root) if not p[0].endswith("scratch.bin")) == Counter(
            written
        )
    recorded = read_trace(trace)
    rows = recorded.table.to_pylist()
    kept = Counter((r["path"], r["ret"]) for r in rows if r["op"] == "write")
    assert kept == Counter(written)  # every write of every file that ended in ckpts/, none of scratch.bin
    assert recorded.metadata["rename_followed_rows"] > 0
    assert recorded.metadata["filtered_rows"] > 0 and recorded.metadata["rename_held_rows_dropped"] == 0
    recorded_tree = tree(root / "ckpts")
    assert recorded_tree["step_1/_METADATA"] == 123 and recorded_tree["latest.txt"] == 777
    for run in range(3):
        target = tmp_path / f"replay-{run}"
        report = replay(trace, target=target, strategy="all", strip_prefix=str(root), verify=True)
        assert not report.size_mismatches
        for strategy in STRATEGIES:
            assert tree(target / strategy / "ckpts") == recorded_tree, (run, strategy)
        report.release()


LINKS = textwrap.dedent("""
    import os, sys
    root = sys.argv[1]
    os.makedirs(os.path.join(root, "step_2"))
    with open(os.path.join(root, "step_2", "w.bin"), "wb") as f:
        f.write(b"w" * 200000)
    os.link(os.path.join(root, "step_2", "w.bin"), os.path.join(root, "step_2", "w.hard"))
    os.symlink("step_2", os.path.join(root, "latest.tmp"))
    os.rename(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))  # a link updated atomically
    os.symlink("/nonexistent/abs/target", os.path.join(root, "abs_link"))
    os.mkdir(os.path.join(root, "gone"))
    os.rmdir(os.path.join(root, "gone"))
""")


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["strace", "bcc"])
def test_links_and_symbolic_links_replay_as_entries(backend_name, request, tmp_path, io_uring):
    backend = request.getfixturevalue(f"{backend_name}_backend")
    out = tmp_path / "ck"
    out.mkdir()
    program = tmp_path / "links.py"
    program.write_text(LINKS)
    trace = tmp_path / "t.arrow"
    record(backend, trace, out, sys.executable, str(program), str(out))
    rows = read_trace(trace).table.to_pylist()
    made = {(r["op"], r["syscall"], r["path"], r["new_path"]) for r in rows if r["op"] in ("link", "symlink")}
    assert made == {
        ("link", "link", f"{out}/step_2/w.bin", f"{out}/step_2/w.hard"),
        ("symlink", "symlink", "step_2", f"{out}/latest.tmp"),
        ("symlink", "symlink", "/nonexistent/abs/target", f"{out}/abs_link"),
    }
    assert any(r["op"] == "unlink" and r["syscall"] == "rmdir" and r["flags"] == 0x200 for r in rows)
    assert tree(out) == {
        "abs_link": "-> /nonexistent/abs/target",
        "latest": "-> step_2",
        "step_2": None,
        "step_2/w.bin": 200000,
        "step_2/w.hard": 200000,
    }
    assert_replays_to(trace, out, tmp_path)
    target = tmp_path / "one"
    replay(trace, target=target, strategy="posix", strip_prefix=str(out))
    assert os.path.samefile(target / "step_2/w.bin", target / "step_2/w.hard")  # one file, two names


@pytest.mark.slow
def test_the_replay_never_resolves_a_path_through_a_symbolic_link(tmp_path):
    """A link the trace made, even one pointing inside the target, is an entry: a later path through it
    is refused with one line, and nothing is written through it."""
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "mkdir", "path": "/c/real"},
            {"op": "symlink", "path": "real", "new_path": "/c/via"},
            {"op": "open", "path": "/c/via/x", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": "/c/via/x", "fd": 3, "offset": 0, "size": 10, "ret": 10},
        ],
    )
    with pytest.raises(Exception, match="symbolic link"):
        replay(trace, target=tmp_path / "r", strategy="posix")
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").rglob("x"))
