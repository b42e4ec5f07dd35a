"""Conformance of torch.distributed.checkpoint async_save / load (see conformance.py)."""

from conformance import make_test

test_dcp_async = make_test("dcp-async")
