#!/usr/bin/env bash
# GPU check in < 10 min: Triton kernel tests natively on CUDA, then `bench --gpu`
# (per-kernel times at V4.1-Flash widths, launches per decode step, decode tokens/s with/without kernels and
# CUDA graphs, bandwidth floor). tests/graphs/test_graphs.py captures and replays real CUDA graphs here.
# Without a GPU it runs the CPU-safe parts: interpreter kernel tests and an interpreter smoke run of the bench.
# Results land in $OUT (default artifacts/gpu_check); BENCHMARKS.md is written by hand from bench.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-artifacts/gpu_check}
mkdir -p "$OUT"
status=0
step() {  # step NAME SECONDS CMD... : run with a time limit, log to $OUT/NAME.txt, remember failures
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "!! $name failed (exit $rc)"; status=1; }
}
KERNEL_TESTS=(tests/kernels/test_kernels_compile.py tests/kernels/test_kernels_mhc.py tests/kernels/test_kernels_router.py tests/kernels/test_kernels_moe.py
              tests/kernels/test_kernels_engram.py tests/kernels/test_kernels_engine.py tests/bench/test_kernels_bench.py
              tests/graphs/test_graphs.py)
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'; } \
    | tee "$OUT/machine.txt"
  # each new shape compiles once natively (~1 s); the interpreter variant is CI's job and is left out here
  step tests_native 300 env -u TRITON_INTERPRET "$PY" -m pytest -q -rs "${KERNEL_TESTS[@]}"
  step bench 240 env -u TRITON_INTERPRET "$PY" -m engine bench --device cuda --config default-small \
    --kernel-config deepseek-v4.1-flash-inference --prompt-len 64 --new-tokens 32 --gpu
else
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "!! a GPU is present but $PY's torch has no CUDA ($("$PY" -c 'import torch; print(torch.__version__)')):" \
         "install a CUDA build of the pinned torch (e.g. pip install torch==2.13.0 --index-url" \
         "https://download.pytorch.org/whl/cu128) and rerun; only the CPU-safe parts run now"
    status=1
  fi
  echo "no CUDA device: running the CPU-safe parts only (interpreter tests, interpreter bench smoke run)"
  step tests_interpreter 300 env TRITON_INTERPRET=1 "$PY" -m pytest -q -rs "${KERNEL_TESTS[@]}"
  step bench_smoke 300 env TRITON_INTERPRET=1 "$PY" -m engine bench --device cpu --config tiny-v4.1 \
    --prompt-len 4 --new-tokens 2 --repeats 1 --threads 1 --gpu
fi
echo "results in $OUT; overall $([ $status -eq 0 ] && echo OK || echo FAILED)"
exit $status
