"""Conformance of numpy.memmap writes through a shared mapping and mapped reads (see conformance.py)."""

from conformance import make_test

test_memmap = make_test("memmap")
