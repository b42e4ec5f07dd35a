"""The ``gds`` strategy: the recorded reads and writes moved between the file and GPU memory through cuFile
(GPUDirect Storage), by KvikIO.

Each data operation is one ``CuFile.pwrite``/``pread`` of the recorded size and offset, from GPU memory
holding the file's replay data or into a device scratch buffer. The data is every strategy's
(``iolayer.pattern.fill``: unique per 4 KiB block and per file, or as compressible as recorded under
``--data recorded-ratio``), so ``--verify`` checks it as it checks posix's: before the clock, the engine's
``replayer.data.Pregenerated`` buffer (every written file's span) is copied to the device whole, and a
write points into it; where it is not (too large for ``REPLAY_PREGENERATE_BYTES`` or for the GPU, or a
write at an unknown offset) the bytes are generated into the worker's host buffer and copied to a device
buffer of the worker's as the write is issued, inside the clock, with a note. Opens, closes, fsyncs and metadata run as posix does. The file is handed to
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
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import pattern

from .data import Pregenerated
from .datapath import DATA_PATHS, DataPathDefaults, WorkerIO
from .engine import Executor
from .paths import TargetRoot
from .plan import PlanOp, ReplayPlan

if TYPE_CHECKING:
    import torch

#: The torch device the gds buffers live on: the GPU. Tests without one set "cpu" (with a KvikIO stand-in)
#: to check, on the CPU, which bytes the data path writes.
DEVICE = "cuda"


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
        self._data: Pregenerated | None = None  # the engine's replay data, set by prepare
        self._device_data: torch.Tensor | None = None  # its buffer on the device
        self._data_address = 0  # the host address of the data's first byte (the device copy's offset 0)
        self._device_data_note: str | None = None  # why it is not there, where it could not be copied
        self._device_scratch: torch.Tensor | None = None
        self._staging: dict[int, torch.Tensor] = {}  # per worker thread: bytes generated as a write is issued
        self._staging_lock = threading.Lock()
        self._generated_bytes = 0  # written from bytes generated as issued (the note), under the lock

    def prepare(self, plan: ReplayPlan, data: Pregenerated | None = None) -> None:
        """Before the clock: the replay data ``data`` (the engine's, ``replayer.data``) copied to the device
        whole, and a device scratch buffer of ``max_io_bytes`` for reads."""
        import torch

        del plan  # what is written is ``data``'s
        self._data, self._device_data, self._device_data_note = data, None, None
        if data is not None and data.buffer is not None:
            host = torch.frombuffer(data.buffer.mmap, dtype=torch.uint8)
            try:
                self._device_data = host.to(DEVICE, copy=True)
            except (RuntimeError, MemoryError) as err:  # torch.OutOfMemoryError is a RuntimeError
                self._device_data_note = (
                    f"gds: the {data.buffer.size_bytes:,} B of replay data did not fit on the device "
                    f"({str(err).splitlines()[0]})"
                )
            del host  # the host buffer is the engine's: no view of it outlives this call
            self._data_address = data.buffer.ptr
        self._device_scratch = torch.empty(self.max_io_bytes, dtype=torch.uint8, device=DEVICE)
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    def transfer(self, io: WorkerIO, op: PlanOp, row: int) -> int:
        return self._transfer(io, io.fd(op.handle), op, write=op.kind == "write")

    def finish(self) -> list[str]:
        """Close the cuFile handles and free the device buffers; the notes say which mode ran and where a
        write's bytes were generated as it was issued."""
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        notes = [f"gds: {self.mode.label}"]
        if self._device_data_note:
            notes.append(self._device_data_note)
        if self._generated_bytes:
            notes.append(
                f"gds: {self._generated_bytes:,} B written were generated in host memory and copied to the "
                "device as each write was issued (inside the clock)"
            )
        self._data, self._device_data, self._device_scratch, self._generated_bytes = None, None, None, 0
        self._staging.clear()
        return notes

    def _scratch(self) -> torch.Tensor:
        """The device scratch buffer ``prepare`` made. Raises ReplayError before ``prepare``."""
        if self._device_scratch is None:
            raise ReplayError("the gds executor's device buffers are made by prepare(), which was not called")
        return self._device_scratch

    def _source(self, io: WorkerIO, key: int, content_offset: int, size: int) -> torch.Tensor:
        """Device memory holding the replay data of [content_offset, + n) of the file with ``key``, n at most
        ``size``: a view of the data copied before the clock where it covers them, else the bytes generated
        now into the worker's host buffer and copied to the worker's device buffer (n at most its size)."""
        import torch

        if self._device_data is not None and self._data is not None:
            address = self._data.address(key, content_offset, size)
            if address is not None:
                start = address - self._data_address
                return self._device_data[start : start + size]
        n = min(size, len(io.write_view))
        pattern.fill(io.write_buf.ptr, n, key, content_offset)
        with self._staging_lock:
            staging = self._staging.get(threading.get_ident())
            if staging is None:
                staging = torch.empty(len(io.write_view), dtype=torch.uint8, device=DEVICE)
                self._staging[threading.get_ident()] = staging
            self._generated_bytes += n
        staging[:n].copy_(torch.frombuffer(io.write_view, dtype=torch.uint8, count=n))
        return staging[:n]

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

    def _transfer(self, io: WorkerIO, fd: int, op: PlanOp, write: bool) -> int:
        """``op.size`` bytes between the file at ``op.offset`` (or the descriptor's position, which is then
        moved on) and GPU memory: the file's replay data written (``_source``), or read into scratch."""
        size, done = op.size or 0, 0
        offset = self._position(fd, op)
        handle = self._cufile(fd, write=write)
        scratch = self._scratch()
        while done < size:
            n = min(self.max_io_bytes, size - done)
            if write:
                base = op.pattern_offset if op.pattern_offset is not None else offset
                source = self._source(io, op.pattern_key, base + done, n)
                n = source.numel()
                moved = handle.pwrite(source, n, offset + done).get()
            else:
                moved = handle.pread(scratch[:n], n, offset + done).get()
            if moved <= 0:
                break
            done += moved
        if op.offset is None:
            os.lseek(fd, offset + done, os.SEEK_SET)
        return done
