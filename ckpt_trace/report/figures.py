"""matplotlib for every figure of ours (report pages, bench heat maps), on the Agg backend: no display needed."""

from __future__ import annotations

import base64
import io

from ckpt_trace.errors import CkptTraceError


def pyplot():
    """matplotlib.pyplot on the Agg backend. Raises CkptTraceError without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise CkptTraceError("figures need matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig, dpi: int = 100) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    return buffer.getvalue()


def png_base64(fig) -> str:
    """The figure as base64 PNG, for a data: URI; the figure is closed."""
    return base64.b64encode(png_bytes(fig)).decode()
