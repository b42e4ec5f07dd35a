"""torchsnapshot (pytorch/torchsnapshot): the ``.snapshot_metadata`` manifest (placeholder until parsed)."""

from __future__ import annotations

from .parsers import LayoutError
from .table import Entry

SNAPSHOT_METADATA = ".snapshot_metadata"


def parse_torchsnapshot(path: str) -> list[Entry]:
    raise LayoutError(f"{path}: torchsnapshot manifests are not parsed yet")
