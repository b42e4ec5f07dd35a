"""ds_ops: the environment that pins one ninja and one build directory for DeepSpeed's JIT ops, and the
stale build lock found rather than waited on (no DeepSpeed needed)."""

import os
import sys
from pathlib import Path

import ds_ops


def test_env_puts_this_interpreters_bin_first_and_a_project_build_dir(tmp_path):
    env = ds_ops.env({"PATH": "/usr/bin:/bin", "CKPT_TRACE_CACHE": str(tmp_path)})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["PATH"].endswith("/usr/bin:/bin")
    assert env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions")
    assert env["CKPT_TRACE_CACHE"] == str(tmp_path)


def test_env_keeps_an_explicit_extensions_dir(tmp_path):
    env = ds_ops.env({"PATH": "/bin", "TORCH_EXTENSIONS_DIR": str(tmp_path / "mine")})
    assert env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")


def test_default_extensions_dir_is_the_projects_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ds_ops.extensions_dir({}) == tmp_path / ".cache" / "ckpt-trace" / "torch_extensions"
    assert ds_ops.extensions_dir({"XDG_CACHE_HOME": str(tmp_path / "x")}) == tmp_path / "x/ckpt-trace/torch_extensions"


def test_a_lock_nobody_holds_is_stale_and_left_in_place(tmp_path):
    assert ds_ops.stale_lock(tmp_path, settle_s=0.2) is None  # no build directory at all
    (tmp_path / "async_io").mkdir()
    assert ds_ops.stale_lock(tmp_path, settle_s=0.2) is None  # a build directory, no lock
    lock = tmp_path / "async_io" / "lock"
    lock.touch()
    assert ds_ops.stale_lock(tmp_path, settle_s=0.2) == lock
    assert lock.exists()


def test_a_lock_held_open_is_a_build_in_progress(tmp_path):
    (tmp_path / "pin_memory").mkdir()
    lock = tmp_path / "pin_memory" / "lock"
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)  # as torch's FileBaton.try_acquire takes it
    try:
        assert ds_ops.stale_lock(tmp_path, settle_s=0.2) is None
    finally:
        os.close(fd)
    assert ds_ops.stale_lock(tmp_path, settle_s=0.2) == lock
