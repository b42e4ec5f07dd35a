"""Conformance of DeepSpeed ZeRO-1 save_checkpoint / load_checkpoint with the FastPersist writer on the CPU:
checkpoint files written through DeepSpeed's libaio handle (O_DIRECT iocbs, the unaligned tail appended with a
plain write), each iocb compared with strace's own log of io_submit (see conformance.py)."""

from conformance import make_test

test_deepspeed_fast = make_test("deepspeed-fast")
