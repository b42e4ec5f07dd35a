"""Tracer: kernel (bcc) or ptrace (strace) events -> per-process file-description state -> rows."""

from .record import (
    BACKENDS,
    BackendChoice,
    RecordResult,
    capture_limits,
    choose_backend,
    environment_notes,
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
    "environment_notes",
    "SyscallEvent",
    "TraceBuilder",
    "choose_backend",
    "how_it_ended",
    "record",
    "resolve_command",
]
