#!/usr/bin/env bash
# Set up, then serve the app on http://localhost:8501 with the shipped default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/streamlit run app.py --server.headless true "$@"
