"""ckpt-trace: record checkpoint I/O into Arrow traces and replay it under other I/O strategies."""

__version__ = "0.1.0"
