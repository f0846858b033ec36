#!/bin/sh
# The "python" of the test Batch image (tests/airflow/batch_dags/batch_probe.py): print
# PROBE_LINES numbered lines with PROBE_MARKER, wait while PROBE_HOLD exists (at most
# 300 s), then run the job with the real interpreter ($PROBE_PYTHON).
if [ -n "$PROBE_MARKER" ] && [ "${PROBE_LINES:-0}" -gt 0 ]; then
    "$PROBE_PYTHON" -c "import os
m = os.environ['PROBE_MARKER']
print('\n'.join(f'{m} line {i:06d} of {os.environ[\"PROBE_LINES\"]}' for i in range(int(os.environ['PROBE_LINES']))), flush=True)"
fi
waited=0
while [ -n "$PROBE_HOLD" ] && [ -e "$PROBE_HOLD" ] && [ "$waited" -lt 3000 ]; do
    sleep 0.1
    waited=$((waited + 1))
done
exec "$PROBE_PYTHON" "$@"
