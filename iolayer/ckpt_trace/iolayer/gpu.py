"""Host<->device copies for replays: the GPU hop of a checkpoint, re-executed with recorded sizes.

Call order: ``probe()`` before the clock (None, or why copies cannot run
here); ``DeviceCopier(max_bytes, pinned_staging)`` per worker, before the
clock (it allocates the device buffer and both host buffers once, so no
allocation or page pinning is timed); ``copy(direction, memory_kind,
size_bytes)`` per recorded copy, which returns when the copy has completed
(the stream is synchronised, as a checkpoint's ``tensor.cpu()`` is);
``close()``. Called by the replay executors.

torch is imported lazily: a replay without copy rows never loads it.
"""

from __future__ import annotations

from ckpt_trace.formats import vocabulary as v

#: Plan encoding of a copy's direction and host memory kind (``PlanOp.flags`` of kind ``copy``).
DIRECTIONS = (v.COPY_H2D, v.COPY_D2H, v.COPY_D2D, v.COPY_H2H, v.COPY_P2P, v.COPY_OTHER)
MEMORY = v.MEMORY_KINDS


def encode(op: str, memory_kind: str | None) -> int:
    """``flags`` of a plan's copy operation: direction index * 16 + memory kind index."""
    direction = DIRECTIONS.index(op) if op in DIRECTIONS else DIRECTIONS.index(v.COPY_OTHER)
    memory = MEMORY.index(memory_kind) if memory_kind in MEMORY else MEMORY.index(v.MEMORY_UNKNOWN)
    return direction * 16 + memory


def decode(flags: int) -> tuple[str, str]:
    """(direction op name, memory kind) of ``encode``'s value."""
    return DIRECTIONS[(flags // 16) % len(DIRECTIONS)], MEMORY[(flags % 16) % len(MEMORY)]


def probe() -> str | None:
    """None when copies can be replayed here (torch with a CUDA device), else why not, in a few words."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU here (torch.cuda.is_available() is false)"
    except RuntimeError as err:  # a broken driver
        return f"CUDA is unusable here ({err})"
    return None


class DeviceCopier:
    """One worker's copy engine: a device buffer and a pinned and a pageable host buffer of ``max_bytes``.

    ``pinned_staging`` replays every host side from pinned memory (the
    strategy DataStates-LLM and DCP's copy-ahead use) instead of the
    recorded memory kind. Raises RuntimeError (torch's) when the device
    has no room for ``max_bytes``.
    """

    def __init__(self, max_bytes: int, *, pinned_staging: bool = False, device: int = 0) -> None:
        import torch

        self._torch = torch
        self.pinned_staging = pinned_staging
        size = max(int(max_bytes), 1)
        self.device = torch.device("cuda", device)
        self.device_buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.other_device_buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        self.pageable = torch.empty(size, dtype=torch.uint8)
        self.pageable.fill_(0)  # first touch before the clock, as the recorded program's buffers were
        self.stream = torch.cuda.Stream(self.device)

    def copy(self, direction: str, memory_kind: str, size_bytes: int) -> None:
        """Copy ``size_bytes`` in ``direction`` with the host side in ``memory_kind`` memory (or pinned, with
        ``pinned_staging``); returns when the copy is complete."""
        torch = self._torch
        n = int(size_bytes)
        pinned = self.pinned_staging or memory_kind == v.MEMORY_PINNED
        if (
            self.pinned is None
            or self.pageable is None
            or self.device_buffer is None
            or self.other_device_buffer is None
        ):
            raise ValueError("the copy engine is closed")
        host = (self.pinned if pinned else self.pageable)[:n]
        device = self.device_buffer[:n]
        with torch.cuda.stream(self.stream):
            if direction == v.COPY_D2H:
                host.copy_(device, non_blocking=pinned)
            elif direction == v.COPY_H2D:
                device.copy_(host, non_blocking=pinned)
            elif direction in (v.COPY_D2D, v.COPY_P2P):
                self.other_device_buffer[:n].copy_(device, non_blocking=True)
            else:
                host.copy_((self.pageable if pinned else self.pinned)[:n])
        self.stream.synchronize()

    def close(self) -> None:
        """Free the buffers (the caching allocator keeps the device memory for the next worker)."""
        self.device_buffer = self.other_device_buffer = self.pinned = self.pageable = None
