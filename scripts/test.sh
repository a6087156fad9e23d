#!/usr/bin/env bash
# The project's test command: set-up (scripts/setup.sh), then every test, unit and integration (real servers).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export SGLANG_USE_CPU_ENGINE=${SGLANG_USE_CPU_ENGINE:-1}
exec .venv/bin/python -m pytest -p no:cacheprovider -q -ra "$@"   # no path: every test (pytest.ini testpaths)
