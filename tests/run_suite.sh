#!/usr/bin/env bash
# The whole suite as `make test` runs it, on two fronts at once:
# - the tests that use the dev broker (marked `broker`, tests/conftest.py), in one pytest
#   run, one at a time as they were written: they time daemons against deadlines;
# - the others, CPU-bound, spread over $TEST_WORKERS pytest-xdist workers.
# The broker run's report follows the other's. Arguments go to both runs.
set -uo pipefail
py=${PYTHON:-.venv/bin/python}
log=$(mktemp -t vigil-broker-tests.XXXXXX)
"$py" -m pytest -q -m broker "$@" >"$log" 2>&1 &
broker=$!
trap 'kill "$broker" 2>/dev/null; rm -f "$log"' EXIT
"$py" -m pytest -q -m "not broker" -n "${TEST_WORKERS:-2}" "$@"
others=$?
echo "--- the broker tests (run beside the others) ---"
wait "$broker"
status=$?
cat "$log"
[ "$others" -eq 0 ] && [ "$status" -eq 0 ]
