#!/usr/bin/env bash
# Set up (venv, requirements, Debian chromium for the browser tests, the prepared corpus), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
if ! command -v chromium >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install Debian chromium; browser tests will fail" >&2
fi
# the corpus the shipped model was trained on (tests re-measure its model card): ~10 s, byte-identical every time;
# prepared again when an older one here has another vocabulary than the shipped model's
if [ ! -f data/shakespeare/manifest.json ] || ! cmp -s data/shakespeare/id_map.json checkpoints/default/id_map.json; then
  .venv/bin/python -m engine prepare_data --out data/shakespeare
fi
# Arguments go to one pytest run (e.g. `bash scripts/test.sh -m "not slow"`, or a single file). Without any, the
# whole suite in two stages: the fast one first (under 3 minutes), so a broken build fails early, then the slow
# one (browser tests, model-card re-measurement, long training runs; tests/conftest.py lists them).
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -m "not slow"
exec .venv/bin/python -m pytest -q -m slow
