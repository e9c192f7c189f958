#!/usr/bin/env bash
# CPU tier (`make test`, CI): lint, then every test not marked gpu or rocm.
#
# Runs with $PYTHON (default: python3), which must have rocm-vit's test extra installed (`make venv`
# does that in .venv). GPUs are hidden so the suite checks the CPU paths on any machine.
set -euo pipefail
source "$(dirname "$0")/common.sh"
PY=${PYTHON:-python3}
export CUDA_VISIBLE_DEVICES="" HIP_VISIBLE_DEVICES=""

"$PY" -c 'import pytest, ruff' 2>/dev/null ||
  die "$PY lacks pytest or ruff: run \`make test\` (it sets up .venv) or pip install -e '.[test]'"

echo "== lint: ruff check, ruff format --check"
"$PY" -m ruff check .
"$PY" -m ruff format --check .

# One pytest worker per core, at most four (each holds torch and the tests' subprocesses); a file's
# tests stay on one worker, so a module's fixture (a tower, a spawned scenario) is built once. The
# files go out in collection order (tests/conftest.py puts the slowest first), not xdist's default of
# the most tests first, which left the slowest files for the end.
workers=${PYTEST_WORKERS:-$("$PY" -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}
echo "== tests: not gpu and not rocm ($workers workers)"
if [ "$workers" -gt 1 ] && "$PY" -c 'import xdist' 2>/dev/null; then
  run_pytest -n "$workers" --dist loadfile --no-loadscope-reorder -m "not gpu and not rocm" tests
else
  run_pytest -m "not gpu and not rocm" tests
fi
