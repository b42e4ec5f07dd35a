"""The library's one exception family; only the CLI turns these into messages and exit codes."""

from ckpt_trace.formats.errors import CkptTraceError, TraceFormatError


class TracerError(CkptTraceError):
    """Recording failed: no usable backend, the command could not start, events were lost under --strict."""


class ReplayError(CkptTraceError):
    """A replay was refused or failed: unsafe target, too little free space, an I/O error."""


class WorkloadError(CkptTraceError):
    """A built-in workload could not run (missing optional dependency, bad parameters)."""


class BenchError(CkptTraceError):
    """``ckpt-trace bench`` was refused or failed: a bad target or output, too little space, a failed process."""


class CheckpointError(CkptTraceError):
    """The emitted checkpoint writer or reader failed: a missing or truncated file, a full disk, no metadata."""


__all__ = ["BenchError", "CheckpointError", "CkptTraceError", "ReplayError", "TraceFormatError", "TracerError", "WorkloadError"]
