"""Conformance of safetensors save_file / load_file (see conformance.py)."""

from conformance import make_test

test_safetensors = make_test("safetensors")
