"""``[core] hostname_callable`` of the test stack's Celery workers.

Both workers run on one machine, where every process has the same host name; each
worker's environment names it (``EMBEDFRESH_TEST_WORKER``), and its task runners report
that name as the task instance's ``hostname``, as two worker hosts would report theirs.
"""

from __future__ import annotations

import os


def hostname() -> str:
    return os.environ["EMBEDFRESH_TEST_WORKER"]
