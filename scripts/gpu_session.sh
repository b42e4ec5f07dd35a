#!/bin/bash
# Run on the GPU machine (the `device` tool): the GPU tests, then benchmarks/gpu_checkpoint.py.
# Needs strace's .deb files in .devtools/ (Debian's strace and libunwind8; the image has no strace).
# With RECORD_GOLDEN=1 it first records traces/golden/v3-gpu-dcp-gpt2-tiny-1rank-strace.arrow (and the
# files the workload wrote, sizes.json; the tensors, tensors.json) into $OUT.
set -u
mkdir -p /tmp/st && for f in .devtools/*.deb; do dpkg -x "$f" /tmp/st; done
export PATH=/tmp/st/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/st/usr/lib/x86_64-linux-gnu
export PYTHONPATH=$PWD:$PWD/formats:$PWD/iolayer:$PWD/replayer:$PWD/tracer PYTHONUNBUFFERED=1
if [ "${RECORD_GOLDEN:-0}" = 1 ]; then
  rm -rf /tmp/ck
  G=v3-gpu-dcp-gpt2-tiny-1rank-strace
  python3 -m ckpt_trace.cli record --backend strace --gpu on --path-filter /tmp/ck/ -o "$OUT/$G.arrow" -- \
    python3 -m ckpt_trace.cli workload dcp --device cuda --model gpt2-tiny --out /tmp/ck 2>&1 | tail -5
  python3 -c "import json; from ckpt_trace.workloads.engines import tensor_bytes; print(json.dumps({'model': 'gpt2-tiny', 'with_optimizer': False, 'tensor_bytes': tensor_bytes('gpt2-tiny', False)}))" > "$OUT/$G.tensors.json"
  python3 -c "import json, pathlib; print(json.dumps({str(p): p.stat().st_size for p in sorted(pathlib.Path('/tmp/ck').rglob('*')) if p.is_file()}, indent=1))" > "$OUT/$G.sizes.json"
fi
python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu.py 2>&1 | tail -8
python3 benchmarks/gpu_checkpoint.py --model "${MODEL:-gpt2-medium}" --engines "${ENGINES:-dcp,emitted,torch-save,safetensors}" \
  --backend strace --target /tmp/gpu-bench \
  --results "$OUT/gpu_checkpoint.json" 2>&1 | tail -20
