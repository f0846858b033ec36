"""The data plane's programs, one module per job: ``python -m embedfresh.jobs.<name>``.

Each reads a pydantic config (:mod:`embedfresh.core.config`), runs a few named steps
built from :mod:`embedfresh.ml`, writes its reports and result record to the artifact
store and exits with a code from :mod:`embedfresh.core.exit_codes`. Nothing here imports
Airflow, and no job imports another.
"""
