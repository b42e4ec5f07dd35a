"""The library's one exception family; only the CLI turns these into messages and exit codes."""

from ckpt_trace.formats.errors import CkptTraceError, TraceFormatError


class TracerError(CkptTraceError):
    """Recording failed: no usable backend, the command could not start, events were lost under --strict."""


class CommandNotFound(TracerError):
    """``record``'s command cannot be started (no such file, not executable): exit 127, as a shell does."""

    exit_code = 127


class ReplayError(CkptTraceError):
    """A replay was refused or failed: unsafe target, too little free space, an I/O error."""


class WorkloadError(CkptTraceError):
    """A built-in workload could not run (missing optional dependency, bad parameters)."""


class BenchError(CkptTraceError):
    """``ckpt-trace bench`` was refused or failed: a bad target or output, too little space, a failed process."""


class Interrupted(CkptTraceError):
    """Ctrl-C: the command stopped; the message says what partial output remains and where (or that it was
    removed). Exit status 130, as a shell reports SIGINT."""

    exit_code = 130


class RegressionError(CkptTraceError):
    """``ckpt-trace check``: a baseline is missing, corrupt, or does not match the traces and strategies being
    checked; a tolerance is malformed."""


class CheckpointError(CkptTraceError):
    """The emitted checkpoint writer or reader failed: a missing or truncated file, a full disk, no metadata."""


class RescaleError(CkptTraceError):
    """A trace that cannot be replayed at another number of ranks (not a DCP save, no layout, a sharding
    rule rescaling does not know); the message says why."""


__all__ = [
    "BenchError",
    "CheckpointError",
    "CkptTraceError",
    "CommandNotFound",
    "Interrupted",
    "RegressionError",
    "ReplayError",
    "RescaleError",
    "TraceFormatError",
    "TracerError",
    "WorkloadError",
]
