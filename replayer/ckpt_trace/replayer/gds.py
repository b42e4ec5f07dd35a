"""The ``gds`` strategy: the recorded reads and writes moved between the file and GPU memory through cuFile
(GPUDirect Storage), by KvikIO.

Each data operation is one ``CuFile.pwrite``/``pread`` of the recorded size and offset, from a device buffer
holding the file's synthetic pattern (the same bytes every other strategy writes, so ``--verify`` holds) or
into a device scratch buffer. Opens, closes, fsyncs and metadata run as posix does. The file is handed to
KvikIO as ``/proc/self/fd/N`` of the descriptor the replay opened beneath the target, so no path is resolved
again.

Whether the bytes really went storage<->GPU without a bounce through host memory depends on the machine:
KvikIO runs in its own compatibility mode (POSIX reads and writes through a host bounce buffer) when
libcufile cannot be loaded, and cuFile in its compatibility mode when the nvidia-fs kernel driver is absent
(``/dev/nvidia-fs*``) or the file system cannot do GDS. ``probe()`` says which; the result's notes carry it,
so a compatibility-mode figure is never mistaken for true GDS. Sources: KvikIO's runtime settings
(``KVIKIO_COMPAT_MODE``, docs.rapids.ai/api/kvikio) and NVIDIA's cuFile API reference, "cuFile
compatibility mode".

Call order (``replay``): ``probe()`` before planning (None, or why gds cannot run here), then the
executor's ``prepare``/``run`` as every executor's: the engine (``replayer.engine``) with ``GdsPath``, this
strategy's ``datapath.DataPath``.
"""

from __future__ import annotations

import glob
import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer.buffers import pattern_buffer

from .datapath import DATA_PATHS, DataPathDefaults, WorkerIO
from .engine import Executor
from .paths import TargetRoot
from .plan import PlanOp, ReplayPlan

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class GdsMode:
    """What ``gds`` runs as here: ``true_gds`` only when KvikIO uses cuFile, cuFile reports GDS available and
    the nvidia-fs driver is loaded; ``label`` says it in a few words for the results."""

    true_gds: bool
    label: str


def probe() -> tuple[str | None, GdsMode | None]:
    """(None, mode) when the gds strategy can run here, else (why not, None)."""
    try:
        import torch
    except ImportError:
        return "gds needs torch with a CUDA GPU (torch is not installed)", None
    if not torch.cuda.is_available():
        return "gds needs a CUDA GPU (torch.cuda.is_available() is false)", None
    try:
        # KvikIO is an optional GPU dependency without type information, absent where the checks run.
        import kvikio  # pyright: ignore[reportMissingImports]
        import kvikio.defaults  # pyright: ignore[reportMissingImports]
    except ImportError:
        return "gds needs KvikIO (pip install kvikio-cu12 or kvikio-cu13)", None
    return None, _mode(kvikio)


def _mode(kvikio) -> GdsMode:
    compat = "unknown"
    try:
        compat = str(kvikio.defaults.get("compat_mode"))
    except Exception:  # noqa: BLE001 - older KvikIO: compat_mode() instead of get()
        try:
            compat = str(kvikio.defaults.compat_mode())
        except Exception:  # noqa: BLE001
            pass
    gds_available = None
    try:
        importlib.import_module("kvikio.cufile_driver")  # makes kvikio.cufile_driver an attribute
    except ImportError:
        pass
    try:
        gds_available = bool(kvikio.cufile_driver.get("is_gds_available"))
    except Exception:  # noqa: BLE001 - older KvikIO: DriverProperties
        try:
            gds_available = bool(kvikio.DriverProperties().is_gds_available)
        except Exception:  # noqa: BLE001
            pass
    nvidia_fs = bool(glob.glob("/dev/nvidia-fs*"))
    kvikio_compat = compat.upper().endswith("ON") or (compat.upper().endswith("AUTO") and not gds_available)
    if not kvikio_compat and gds_available and nvidia_fs:
        return GdsMode(True, f"true GDS (KvikIO {kvikio.__version__}, cuFile, nvidia-fs loaded)")
    reasons = []
    if kvikio_compat:
        reasons.append(f"KvikIO compat_mode {compat}: POSIX through a host bounce buffer")
    if not gds_available:
        reasons.append("cuFile reports GDS unavailable")
    if not nvidia_fs:
        reasons.append("no nvidia-fs driver (/dev/nvidia-fs*)")
    return GdsMode(False, f"compatibility mode, not true GDS (KvikIO {kvikio.__version__}: {'; '.join(reasons)})")


def gds_executor(root: TargetRoot, max_io_bytes: int, mode: GdsMode) -> Executor:
    """The engine with the gds data path (the gds strategy's executor; ``probe`` said ``mode``)."""
    return Executor(root, max_io_bytes, GdsPath(max_io_bytes, mode))


class GdsPath(DataPathDefaults):
    """Reads and writes through KvikIO's ``CuFile`` between the file and GPU memory, in pieces of at most
    ``max_io_bytes``; see the module docstring. Every data operation runs alone (no runs)."""

    name = "gds"
    path_code: int | None = DATA_PATHS.index("cufile")
    maps_files = False  # mapped I/O is replayed as reads and writes through cuFile
    queues_as_recorded = False
    kernel_copies = False  # in-kernel copies as a read and a write, through this path
    separates_reads_and_writes = False

    def __init__(self, max_io_bytes: int, mode: GdsMode) -> None:
        self.max_io_bytes = max_io_bytes
        self.mode = mode
        self._files: dict[tuple[int, int, str], Any] = {}  # kvikio.CuFile (untyped optional dependency)
        self._device_pattern: torch.Tensor | None = None  # set by prepare
        self._device_scratch: torch.Tensor | None = None

    def prepare(self, plan: ReplayPlan) -> None:
        """The device buffers: the replay data's pattern (``max_io_bytes`` and a period) and scratch."""
        import torch

        host = pattern_buffer(self.max_io_bytes + pattern.PERIOD)
        try:
            self._device_pattern = torch.frombuffer(host.mmap, dtype=torch.uint8).cuda()
        finally:
            host.close()
        self._device_scratch = torch.empty(self.max_io_bytes, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()

    def transfer(self, io: WorkerIO, op: PlanOp, row: int) -> int:
        return self._transfer(io.fd(op.handle), op, write=op.kind == "write")

    def finish(self) -> list[str]:
        """Close the cuFile handles; the note says which mode ran."""
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        return [f"gds: {self.mode.label}"]

    def _device_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(pattern, scratch): the device buffers ``prepare`` made. Raises ReplayError before ``prepare``."""
        if self._device_pattern is None or self._device_scratch is None:
            raise ReplayError("the gds executor's device buffers are made by prepare(), which was not called")
        return self._device_pattern, self._device_scratch

    def _cufile(self, fd: int, write: bool):
        import kvikio  # pyright: ignore[reportMissingImports]  # optional GPU dependency, see probe

        st = os.fstat(fd)
        flags = "r+" if write else "r"
        key = (st.st_dev, st.st_ino, flags)
        handle = self._files.get(key)
        if handle is None:
            handle = self._files[key] = kvikio.CuFile(f"/proc/self/fd/{fd}", flags)
        return handle

    def _position(self, fd: int, op: PlanOp) -> int:
        return op.offset if op.offset is not None else os.lseek(fd, 0, os.SEEK_CUR)

    def _transfer(self, fd: int, op: PlanOp, write: bool) -> int:
        """``op.size`` bytes between the file at ``op.offset`` (or the descriptor's position, which is then
        moved on) and GPU memory: the file's pattern written from the device buffer, or read into scratch."""
        size, done = op.size or 0, 0
        offset = self._position(fd, op)
        handle = self._cufile(fd, write=write)
        device_pattern, device_scratch = self._device_buffers()
        while done < size:
            n = min(self.max_io_bytes, size - done)
            if write:
                base = op.pattern_offset if op.pattern_offset is not None else offset
                first = pattern.start(base + done, op.pattern_key)
                moved = handle.pwrite(device_pattern[first : first + n], n, offset + done).get()
            else:
                moved = handle.pread(device_scratch[:n], n, offset + done).get()
            if moved <= 0:
                break
            done += moved
        if op.offset is None:
            os.lseek(fd, offset + done, os.SEEK_SET)
        return done
