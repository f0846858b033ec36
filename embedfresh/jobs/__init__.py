"""The data plane's programs, one module per job: ``python -m embedfresh.jobs.<name>``.

Each reads a pydantic config (:mod:`embedfresh.core.config`), runs a few named steps
built from :mod:`embedfresh.ml`, writes its reports and result record to the artifact
store and exits with a code from :mod:`embedfresh.core.exit_codes`. Nothing here imports
Airflow, and no job imports another.
"""

import os as _os

from embedfresh.core.threads import WAIT_POLICY as _WAIT_POLICY

# Before any job module (or the fork server) imports torch: OpenMP reads its wait policy
# once, when its runtime starts, so it must be in the environment of the process that
# loads it. An operator's own OMP_WAIT_POLICY wins.
_os.environ.setdefault(*_WAIT_POLICY)
