"""Conformance of DeepSpeed ZeRO-1 save_checkpoint / load_checkpoint on the CPU (see conformance.py)."""

from conformance import make_test

test_deepspeed = make_test("deepspeed")
