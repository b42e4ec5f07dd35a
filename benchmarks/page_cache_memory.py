"""Memory of the ``cold_bytes`` post-processing (``tracer.page_cache``) on a large synthetic insert stream.

A sequential cold load of ``--gib`` GiB from one file: page-cache insertions of ``--folio-pages`` pages each
(a 64 MiB cold load on ext4 / Linux 6.18 inserted 16,384 pages in 953 folios, about 17 per folio), fed in
batches of 4,096 records as the bcc backend hands them over, then one read row per MiB (each ending after
its pages came in), whose ``cold_bytes`` column is computed. Each variant runs in a child process: its peak
resident memory above what it held before the feeding (``ru_maxrss`` minus the RSS after imports and the
read table), its wall time, and the sum of the column (every variant must give the same). ``--reference
FILE`` adds another implementation of the module (for instance the per-page one:
``git show ae1e82a:tracer/ckpt_trace/tracer/page_cache.py``); variants alternate, ``--repeat`` times.

    python benchmarks/page_cache_memory.py --gib 32 --folio-pages 16 [--reference OLD.py] [--repeat 2]

Measured (2 cores shared with other jobs, load average 2.6-2.8, one child per line; the sums of the column
agreed every time): 16-page folios, 32 GiB (524,288 records): intervals +69 MiB, per-page +713 MiB (twice
each, ABBA, identical peaks); 100 GiB (1,638,400 records, 26,214,400 pages): +241 and +242 MiB against
+2,217 MiB (once); 1-page folios, 8 GiB (2,097,152 records): +273 MiB against +373 MiB (twice each): a run
keeps each folio's own insertion time, so one-page folios fold into no fewer runs. Times (0.1-3.4 s) are
within the noise of this machine and not compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import importlib.util, json, os, resource, sys, time
import numpy as np, pyarrow as pa
source, path, gib, folio = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if source == "-":
    from ckpt_trace.tracer import page_cache
else:
    spec = importlib.util.spec_from_file_location("page_cache_ref", source)
    page_cache = importlib.util.module_from_spec(spec); sys.modules[spec.name] = page_cache
    spec.loader.exec_module(page_cache)
PAGE = page_cache.PAGE_BYTES
st = os.stat(path)
dev, ino = page_cache.kernel_dev(st.st_dev), st.st_ino
pages = (gib << 30) // PAGE
read_pages = (1 << 20) // PAGE
reads = pages // read_pages
n = reads
table = pa.table({
    "op": pa.array(["read"] * n), "interface": pa.array(["syscall"] * n), "path": pa.array([path] * n),
    "offset": pa.array(np.arange(n, dtype=np.int64) << 20), "ret": pa.array(np.full(n, 1 << 20, np.int64)),
    "size": pa.array(np.full(n, 1 << 20, np.int64)), "ts_ns": pa.array(np.zeros(n, np.int64)),
    # read k ends after the folios of its MiB came in (folio f inserted at 10 * f ns)
    "dur_ns": pa.array((np.arange(1, n + 1, dtype=np.int64) * read_pages // folio + 1) * 10),
})
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
base = rss()
start = time.perf_counter()
state = page_cache.Inserts()
folios = pages // folio
batch = 4096
for b in range(0, folios, batch):
    f = np.arange(b, min(b + batch, folios), dtype=np.int64)
    state.add_arrays(f * 10, np.full(len(f), dev), np.full(len(f), ino), f * folio, f * folio + folio - 1)
column = state.cold_bytes(table)
elapsed = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_above_base_bytes": peak - base, "elapsed_s": elapsed, "events": state.events,
                  "cold_sum": int(np.sum(column.to_numpy())), "pages": state.pages()}))
"""


def _run(source: str, path: str, gib: int, folio: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, source, path, str(gib), str(folio)], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        sys.exit(f"page_cache_memory: {source} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=int, default=32)
    parser.add_argument("--folio-pages", type=int, default=16)
    parser.add_argument("--reference", help="another page_cache.py to compare with")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    variants = {"intervals": "-", **({"reference": args.reference} if args.reference else {})}
    with tempfile.TemporaryDirectory() as scratch:
        path = str(Path(scratch) / "load.bin")
        Path(path).write_bytes(b"")
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        for round_ in range(args.repeat):
            order = list(variants.items())
            for name, source in order if round_ % 2 == 0 else order[::-1]:
                started = time.time()
                result = _run(source, path, args.gib, args.folio_pages)
                print(
                    f"{name:10s} {args.gib} GiB, {result['events']:,} events, {result['pages']:,} pages: "
                    f"peak +{result['peak_above_base_bytes'] / 2**20:,.0f} MiB, {result['elapsed_s']:.2f} s, "
                    f"cold {result['cold_sum']:,} B (wall {time.time() - started:.1f} s, load {os.getloadavg()[0]:.2f})"
                )


if __name__ == "__main__":
    main()
