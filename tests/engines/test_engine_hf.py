"""Conformance of Hugging Face save_pretrained / from_pretrained (sharded safetensors with an index) (see conformance.py)."""

from conformance import make_test

test_hf = make_test("hf")
