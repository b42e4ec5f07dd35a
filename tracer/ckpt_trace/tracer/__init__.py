"""Tracer: kernel (bcc) or ptrace (strace) events -> per-process file-description state -> rows."""

from .record import BACKENDS, BackendChoice, RecordResult, check_output, choose_backend, record
from .state import SyscallEvent, TraceBuilder

__all__ = ["BACKENDS", "BackendChoice", "RecordResult", "SyscallEvent", "TraceBuilder", "check_output", "choose_backend", "record"]
