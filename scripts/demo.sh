#!/usr/bin/env bash
# The project's main job: set-up, then `radixflow demo` (makes tiny models, serves them with radixflow on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/radixflow demo "$@"
