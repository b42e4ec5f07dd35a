"""Conformance of the Run:ai model streamer (io_uring reads) of a safetensors file (see conformance.py)."""

from conformance import make_test

test_runai = make_test("runai")
