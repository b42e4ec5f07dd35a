"""Tracer: kernel (bcc) or ptrace (strace) events -> per-process file-description state -> rows."""

from .record import (
    BACKENDS,
    BackendChoice,
    RecordResult,
    capture_limits,
    choose_backend,
    how_it_ended,
    record,
    resolve_command,
)
from .state import SyscallEvent, TraceBuilder

__all__ = [
    "BACKENDS",
    "BackendChoice",
    "RecordResult",
    "capture_limits",
    "SyscallEvent",
    "TraceBuilder",
    "choose_backend",
    "how_it_ended",
    "record",
    "resolve_command",
]
