#!/usr/bin/env bash
# The GPU checks, in one call of under 10 minutes on a lent machine (or any CUDA host):
#   1. the official-format routes (scripts/gpu_routes.py) on an official checkpoint written from the shipped model
#      by `engine quantize`: the whole model on the GPU; torchrun with as many ranks as GPUs (NCCL; with one GPU, a
#      one-rank launch, and two gloo ranks on the CPU for the split code path); the routed experts in host RAM.
#      One results file, $OUT/gpu_routes.json: load s, prefill / decode tokens/s, each GPU's and the host's peak
#      memory, and the greedy text's sha256 per route (equal: the same model on every route).
#   2. the Triton kernel tests natively on CUDA (tests/graphs captures and replays real CUDA graphs), then
#      `engine bench --gpu` (per-kernel times at V4.1-Flash widths, launches per step, decode tokens/s).
# Python: the machine's python3 with its CUDA build of torch (device machines: torch 2.11, Triton 3.6), not the
# CPU-only .venv. Packages it lacks travel as wheels in .whl/ (scripts/gpu_wheels.sh downloads them here) and are
# installed to /tmp/site first. Without a GPU it runs the CPU-safe parts: the routes on the CPU, the interpreter
# kernel tests and an interpreter smoke run of the bench. Results land in $OUT (default artifacts/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  PY=python3
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || PY=.venv/bin/python
fi
OUT=${OUT:-artifacts/gpu_check}
WORK=${WORK:-/tmp/v41viz_gpu_check}
mkdir -p "$OUT" "$WORK"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || { echo "!! could not install .whl/"; exit 1; }
fi
export PYTHONUNBUFFERED=1
status=0
step() {  # step NAME SECONDS CMD... : run with a time limit, log to $OUT/NAME.txt, remember failures
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "!! $name failed (exit $rc)"; status=1; }
}
KERNEL_TESTS=(tests/kernels/test_kernels_compile.py tests/kernels/test_kernels_mhc.py tests/kernels/test_kernels_router.py
              tests/kernels/test_kernels_moe.py tests/kernels/test_kernels_engram.py tests/kernels/test_kernels_engine.py
              tests/bench/test_kernels_bench.py tests/graphs/test_graphs.py)
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  DEVICE=cuda
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'; } \
    | tee "$OUT/machine.txt"
else
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "!! a GPU is present but $PY's torch has no CUDA ($("$PY" -c 'import torch; print(torch.__version__)')):" \
         "run with the machine's CUDA python3 (PY=python3) or install a CUDA build of torch; only the CPU-safe parts run"
    status=1
  fi
  GPUS=0
  DEVICE=cpu
  echo "no CUDA device: running the CPU-safe parts only"
fi

# 1. official-format routes
OFFICIAL=$WORK/official
rm -rf "$OFFICIAL"
step quantize 120 "$PY" -m engine quantize --checkpoint checkpoints/default --out "$OFFICIAL" --shards 4
ROUTES=()
route() {  # route NAME SECONDS ROUTE LAUNCHER... : one gpu_routes.py launch; its results file kept for the merge
  local name=$1 limit=$2 kind=$3; shift 3
  step "route_$name" "$limit" "$@" scripts/gpu_routes.py --route "$kind" --checkpoint "$OFFICIAL" \
    --results "$WORK/$name.json" --device "${ROUTE_DEVICE:-$DEVICE}"
  [ -f "$WORK/$name.json" ] && ROUTES+=("$WORK/$name.json")
}
TORCHRUN=("$PY" -m torch.distributed.run --standalone)
route plain 120 plain "$PY"
route torchrun 150 torchrun "${TORCHRUN[@]}" --nproc-per-node "$(( GPUS > 0 ? GPUS : 2 ))"
if [ "$GPUS" -eq 1 ]; then  # the split code path on one GPU's host: two gloo ranks on the CPU
  ROUTE_DEVICE=cpu route torchrun_cpu 150 torchrun "${TORCHRUN[@]}" --nproc-per-node 2
fi
route host_experts 120 host-experts "$PY"
"$PY" - "$OUT/gpu_routes.json" "${ROUTES[@]}" <<'EOF' || status=1
import json, sys
from engine.bench.results_file import check
out, files = sys.argv[1], sys.argv[2:]
parts = [json.load(open(f)) for f in files]
if not parts:
    sys.exit("no route wrote a results file")
merged = {**parts[0], "command": " ; ".join(p["command"] for p in parts),
          "wall_s": round(sum(p["wall_s"] for p in parts), 1), "rows": [r for p in parts for r in p["rows"]]}
assert not check(merged), check(merged)
json.dump(merged, open(out, "w"), indent=1)
texts = {r["text_sha256"] for r in merged["rows"]}
print(f"{len(merged['rows'])} routes → {out}; greedy texts {'equal' if len(texts) == 1 else 'DIFFER'} across routes")
sys.exit(0 if len(texts) == 1 else 1)
EOF

# 2. kernels and the GPU bench
if [ "$DEVICE" = cuda ]; then
  # each new shape compiles once natively (~1 s); the interpreter variant is CI's job and is left out here
  step tests_native 200 env -u TRITON_INTERPRET "$PY" -m pytest -q -rs -p no:cacheprovider "${KERNEL_TESTS[@]}"
  step bench 150 env -u TRITON_INTERPRET "$PY" -m engine bench --device cuda --config default-small \
    --kernel-config deepseek-v4.1-flash-inference --prompt-len 64 --new-tokens 32 --gpu
else
  step tests_interpreter 300 env TRITON_INTERPRET=1 "$PY" -m pytest -q -rs -p no:cacheprovider "${KERNEL_TESTS[@]}"
  step bench_smoke 300 env TRITON_INTERPRET=1 "$PY" -m engine bench --device cpu --config tiny-v4.1 \
    --prompt-len 4 --new-tokens 2 --repeats 1 --threads 1 --gpu
fi
echo "results in $OUT; overall $([ $status -eq 0 ] && echo OK || echo FAILED)"
exit $status
