"""How much of the emitted writer's and reader's checksum work is on their critical path.

One process saves and loads ``--model`` with Adam state (``emitted_writer.py``'s state) through
``CheckpointWriter``/``CheckpointReader`` (default options), the page cache dropped before each, ``--runs``
times, with timers wrapped around the writer's internals:

- ``crc_s``: seconds computing the save's CRC32C (on the file's checksum thread: off the path);
- ``save_waited_for_crc_s``: seconds the writer thread waited for those checksums (before refilling a
  staging buffer, and at the end): what the save pays;
- ``verify_s``: seconds the reader's ``Verifier`` thread spent checking (off the path);
- ``load_waited_for_verify_s``: seconds the load waited for it at its end (``Verifier.finish``);
- ``staging_copy_s``: seconds the writer threads spent in their staging copies, which, where the CPU has
  AVX-512 and VPCLMULQDQ, also compute the CRC-32 in the same pass (``staging.one_pass_crc32``).

Where that one pass is possible, runs alternate with it on and off (``one_pass`` per run), and the
summary compares the save's checksum work each way: ``staging_copy_s + crc_s`` (median, min-max).

A wall-clock comparison with checksums off is ``emitted_writer.py --pairs``; on a loaded machine its
noise is far above these figures, which is why this one counts time on the threads instead.

    python benchmarks/checksum_overlap.py [--model gpt2-small] [--runs 3] [--scratch DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import emitted_writer
from common import drop_caches


def _timed(owner, name: str, spent: dict, key: str) -> None:
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - started

    setattr(owner, name, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch.distributed.checkpoint as dcp

    import ckpt_trace.writer.checksum as checksum
    import ckpt_trace.writer.load as load
    import ckpt_trace.writer.staging as staging
    from ckpt_trace import config
    from ckpt_trace.writer import CheckpointReader, CheckpointWriter

    keys = ("crc_s", "save_waited_for_crc_s", "verify_s", "load_waited_for_verify_s", "staging_copy_s")
    spent = dict.fromkeys(keys, 0.0)
    _timed(staging, "update_checksum", spent, "crc_s")
    _timed(staging, "copy_bytes", spent, "staging_copy_s")
    _timed(staging, "copy_crc32", spent, "staging_copy_s")
    one_pass_function = staging.one_pass_crc32()
    _timed(staging.StagedFile, "_wait_checksums", spent, "save_waited_for_crc_s")
    _timed(load, "checksum", spent, "verify_s")
    _timed(checksum.Verifier, "finish", spent, "load_waited_for_verify_s")
    emitted_writer.MODEL = args.model
    state = emitted_writer._state()
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-crc-", dir=args.scratch))
    try:
        for run in range(args.runs * (2 if one_pass_function else 1)):
            one_pass = one_pass_function is not None and run % 2 == 0
            config.ONE_PASS_CHECKS = int(one_pass)
            spent.update(dict.fromkeys(keys, 0.0))
            out = scratch / "ckpt"
            shutil.rmtree(out, ignore_errors=True)
            drop_caches()
            started = time.perf_counter()
            dcp.save(state, storage_writer=CheckpointWriter(out))
            save_s = time.perf_counter() - started
            target = emitted_writer._zeros(emitted_writer._state_shapes())
            drop_caches()
            started = time.perf_counter()
            dcp.load(target, storage_reader=CheckpointReader(out))
            load_s = time.perf_counter() - started
            row = {"one_pass": one_pass, "save_s": save_s, "load_s": load_s, **spent}
            rows.append(row)
            print(
                f"{'one pass' if one_pass else 'copy, then CRC'}: save {save_s:.2f} s: staging copies "
                f"{row['staging_copy_s']:.3f} s, CRC {row['crc_s']:.3f} s on the checksum thread, the writer waited "
                f"{row['save_waited_for_crc_s'] * 1e3:.0f} ms ({row['save_waited_for_crc_s'] / save_s:.2%}); "
                f"load {load_s:.2f} s: verify {row['verify_s']:.3f} s on its thread, the load waited "
                f"{row['load_waited_for_verify_s'] * 1e3:.0f} ms ({row['load_waited_for_verify_s'] / load_s:.2%})",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {}
    for one_pass in (True, False):
        work = sorted(row["staging_copy_s"] + row["crc_s"] for row in rows if row["one_pass"] == one_pass)
        if work:
            summary["one pass" if one_pass else "copy, then CRC"] = {
                "median_s": statistics.median(work),
                "min_s": work[0],
                "max_s": work[-1],
            }
    for way, figures in summary.items():
        print(
            f"{way:>15}: staging copies + CRC {figures['median_s']:.3f} s "
            f"({figures['min_s']:.3f}-{figures['max_s']:.3f}), median of {args.runs}"
        )
    out = emitted_writer.RESULTS / "checksum_overlap.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"benchmark": "checksum_overlap", "model": args.model, "runs": rows, "summary": summary}, indent=2)
        + "\n"
    )
    print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
