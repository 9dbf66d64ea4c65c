#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtual environment with the pinned requirements, and this project
# installed editable (so `engine` and `v41viz` import from any directory). A second run takes a few seconds.
# `--tests` (scripts/test.sh) also installs the test-only packages of requirements-test.txt (transformers, the
# oracle of the V4 differential test; ruff, the linter; import-linter, the import-order check); the app's set-up
# (scripts/run_app.sh) leaves them out.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=requirements.txt
if [ "${1:-}" = "--tests" ]; then
  requirements=requirements-test.txt
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r "$requirements"
# --no-deps: requirements.txt above installed every dependency (torch pinned to the CPU build); pyproject.toml
# only states ranges, and resolving them could pull a CUDA torch.
here="$(pwd -P)"
installed="$(cd / && "$here/.venv/bin/python" -c 'import engine; print(engine.__file__)' 2>/dev/null || true)"
if [ "$installed" != "$here/engine/__init__.py" ]; then
  .venv/bin/python -m pip install -qq --no-deps -e .
fi
# the CPU kernels (few-token mHC seams, few-row RMSNorms, few-row FP8/FP4 linears, FP8 activation rounding), built once per machine into torch's extension cache
# (~20 s each the first time, then a fraction of a second), so that the app's first generation does not wait for
# the compiler; where one cannot be built the engine says why and keeps its Python path
.venv/bin/python -W ignore::RuntimeWarning -c '
from engine.kernels import cpu_fp8_round, cpu_norm, cpu_quant_linear, cpu_seam
for kernel in (cpu_seam, cpu_norm, cpu_quant_linear, cpu_fp8_round):
    kernel.load() or print("note: " + kernel.unavailable_reason())'
