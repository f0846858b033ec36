"""Runners: where a job spec runs (local subprocess, AWS Batch).

The AWS Batch runner imports the Amazon provider (and boto3) only when it is used.
"""

from embedfresh.operators.runners.aws_batch import AwsBatchRunner, BatchSettings
from embedfresh.operators.runners.base import DeferrableRunner, JobResult, Runner
from embedfresh.operators.runners.local import LocalRunner

__all__ = [
    "AwsBatchRunner",
    "BatchSettings",
    "DeferrableRunner",
    "JobResult",
    "LocalRunner",
    "Runner",
]
