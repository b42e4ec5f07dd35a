"""Conformance of fastsafetensors SafeTensorsFileLoader (CPU path, no GDS) of a safetensors file (see conformance.py)."""

from conformance import make_test

test_fastsafetensors = make_test("fastsafetensors")
