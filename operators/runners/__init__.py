"""Runners: where a job spec runs. Only the local one exists so far."""

from operators.runners.base import JobResult, Runner
from operators.runners.local import LocalRunner

__all__ = ["JobResult", "LocalRunner", "Runner"]
