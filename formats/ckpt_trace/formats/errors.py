"""Root of the ckpt-trace exception family.

It lives in the lowest layer (formats imports nothing else of ours), and
``ckpt_trace.errors`` re-exports it beside the other stages' errors, so a
caller catches every library failure with ``except CkptTraceError``.
"""

from __future__ import annotations

from collections.abc import Callable


class CkptTraceError(Exception):
    """Base class of every error raised by ckpt-trace on purpose.

    ``str(err)`` is a one-line, user-facing message; the CLI prints it and
    exits with ``err.exit_code``.

    A library message never names a command-line flag (it reads wrong from
    Python). Where a parameter of the call decides the matter, the message
    says ``{option}`` where it would name it, and the error carries
    ``option``, the keyword argument's name (``"force"``, ``"queue_depth"``;
    ``switch=True`` for a boolean one). ``render(name)`` fills the
    placeholder with ``name(option)``: ``str(err)`` in Python's terms
    (``queue_depth``, ``force=True``), the CLI with its flag::

        ReplayError("{option} must be at least 1", option="repeat")
        str(err)  -> "repeat must be at least 1"
        CLI line  -> "--repeat must be at least 1"
        ReplayError("target t is not empty (use {option} to replay into it)", option="force", switch=True)
        str(err)  -> "target t is not empty (use force=True to replay into it)"
        CLI line  -> "target t is not empty (use --force to replay into it)"
    """

    exit_code = 2

    def __init__(self, message: str = "", *, option: str | None = None, switch: bool = False) -> None:
        super().__init__(message)
        self.option, self.switch = option, switch

    def render(self, name: Callable[[str], str] | None = None) -> str:
        """The one line, the option named by ``name(option)`` (a CLI flag), or in Python's terms without it."""
        message = str(self.args[0]) if self.args else ""
        if self.option is None:
            return message
        named = name(self.option) if name is not None else f"{self.option}=True" if self.switch else self.option
        return message.replace("{option}", named)

    def __str__(self) -> str:
        return self.render()

    def __reduce__(self):  # the option survives pickling (a distributed replay's worker to its parent)
        return _rebuild, (type(self), self.args, self.option, self.switch, self.__dict__)


def _rebuild(cls: type[CkptTraceError], args: tuple, option: str | None, switch: bool, state: dict) -> CkptTraceError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    error.option, error.switch = option, switch
    return error


class TraceFormatError(CkptTraceError):
    """A trace file is missing, corrupt, truncated, or of an unsupported version."""
