#!/usr/bin/env bash
# Set up (venv, requirements, Debian chromium for the browser tests, the prepared corpus), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install Debian chromium; browser tests will fail" >&2
fi
# the corpus the shipped model was trained on (tests re-measure its model card): ~10 s, byte-identical every time
[ -f data/shakespeare/manifest.json ] || .venv/bin/python -m engine prepare_data --out data/shakespeare
exec .venv/bin/python -m pytest -q "$@"
