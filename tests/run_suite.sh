#!/usr/bin/env bash
# The whole suite as `make test` runs it, as two pytest runs side by side: the tests that use
# the dev broker (marked `broker`, tests/conftest.py), which spend most of their time waiting
# on daemons and the broker, and the others, which are CPU-bound. Each run keeps its tests in
# order, one at a time: both kinds time things against deadlines, which a third busy process
# on two cores would break. The broker run's report follows the other's; arguments go to both.
set -uo pipefail
py=${PYTHON:-.venv/bin/python}
log=$(mktemp -t vigil-broker-tests.XXXXXX)
"$py" -m pytest -q -m broker "$@" >"$log" 2>&1 &
broker=$!
trap 'kill "$broker" 2>/dev/null; rm -f "$log"' EXIT
"$py" -m pytest -q -m "not broker" "$@"
others=$?
echo "--- the broker tests (run beside the others) ---"
wait "$broker"
status=$?
cat "$log"
[ "$others" -eq 0 ] && [ "$status" -eq 0 ]
