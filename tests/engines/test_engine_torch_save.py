"""Conformance of torch.save / torch.load of a state dict (see conformance.py)."""

from conformance import make_test

test_torch_save = make_test("torch-save")
