"""Root of the ckpt-trace exception family.

It lives in the lowest layer (formats imports nothing else of ours), and
``ckpt_trace.errors`` re-exports it beside the other stages' errors, so a
caller catches every library failure with ``except CkptTraceError``.
"""


class CkptTraceError(Exception):
    """Base class of every error raised by ckpt-trace on purpose.

    ``str(err)`` is a one-line, user-facing message; the CLI prints it and
    exits with ``err.exit_code``.
    """

    exit_code = 2


class TraceFormatError(CkptTraceError):
    """A trace file is missing, corrupt, truncated, or of an unsupported version."""
