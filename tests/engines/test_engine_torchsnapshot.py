"""Conformance of TorchSnapshot Snapshot.take / restore (see conformance.py)."""

from conformance import make_test

test_torchsnapshot = make_test("torchsnapshot")
