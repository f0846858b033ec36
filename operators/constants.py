"""String enums and limits shared by the operators and their runners."""

from __future__ import annotations

from enum import StrEnum


class ExecutionMode(StrEnum):
    """Where a job runs. The operator says *what* to run; the mode says *where*."""

    LOCAL = "local"
    """A subprocess on the Airflow worker (embedded demo, tests, a single box)."""
