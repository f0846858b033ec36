"""String enums and limits shared by the operators and their runners."""

from __future__ import annotations

from enum import StrEnum


class ExecutionMode(StrEnum):
    """Where a job runs. The operator says *what* to run; the mode says *where*."""

    LOCAL = "local"
    """A subprocess on the Airflow worker (embedded demo, tests, a single box)."""

    AWS_BATCH = "aws_batch"
    """An AWS Batch job, single-node or multi-node parallel (production trn1/p5 fleets)."""


#: Environment variable a job reads its default artifact root from
#: (``jobs.config.DEFAULT_ARTIFACT_ROOT_ENV``); remote runners set it in the container.
ARTIFACT_ROOT_ENV = "EMBEDFRESH_ARTIFACT_ROOT"
