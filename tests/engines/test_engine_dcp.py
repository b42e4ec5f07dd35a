"""Conformance of torch.distributed.checkpoint save / load (FileSystemWriter/Reader) (see conformance.py)."""

from conformance import make_test

test_dcp = make_test("dcp")
