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
# whole suite in three stages on a 2-core machine:
# - the fast stage first, so that a broken build fails early: under 3 minutes on 2 cores. Two workers (pytest-xdist;
#   each test process computes on one thread), handed whole files (--dist loadfile: a module's fixtures are built
#   once, and a file's tests never race each other over what they share); --durations names the slowest tests,
#   the ones to make cheaper (or to mark slow, saying why) when the stage nears its limit.
# - then the slow stage, also on two workers with whole files each: its tests (browser tests, model-card
#   re-measurement, long training runs, torchrun launches, torch.compile) mostly wait on servers, browsers, ranks or
#   the compiler, and every patience limit waits on a state, so two files side by side keep to their limits.
# - last, the full-width rehearsal's tests (marked full_width): the first writes its 6.2 GiB synthetic official
#   folder (checkpoints/v4.1-flash-rehearsal, ~14 minutes on 2 cores, then reused), and each loads 9.5 GiB, so they
#   run one at a time, on one worker.
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -m "not slow" -n 2 --dist loadfile --durations=15
.venv/bin/python -m pytest -q -m "slow and not full_width" -n 2 --dist loadfile
exec .venv/bin/python -m pytest -q -m full_width -p no:xdist --durations=5
