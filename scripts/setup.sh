#!/usr/bin/env bash
# Create .venv (if missing) and install the project with SGLang 0.5.23 and the test, bench and scale (gateway) extras.
# Idempotent: a second run only re-checks the install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# Editable install: the tests import the source tree, the servers they start import the same files.
.venv/bin/python -m pip install --quiet -e ".[test,bench,scale]"
