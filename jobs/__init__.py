"""Data plane: plain programs run as ``python -m jobs.<name> --config FILE``.

Nothing in this package imports Airflow. Every job reads a pydantic config, writes a
JSON report to the artifact store and exits with a code from :mod:`jobs.exit_codes`.
"""
