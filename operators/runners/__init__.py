"""Runners: where a job spec runs (local subprocess, AWS Batch), registered by name.

An operator's ``execution_mode`` names one of the runners registered here (one line
each, the implementation named as ``"module:attribute"`` and imported when a task first
uses it); a new runner is one module beside these plus one :func:`register_runner` line.
The AWS Batch runner imports the Amazon provider (and boto3) only when it is used.
"""

from embedfresh.core.settings import ExecutionMode
from embedfresh.operators.runners.aws_batch import AwsBatchRunner, BatchSettings
from embedfresh.operators.runners.base import (
    AttachingRunner,
    DeferrableRunner,
    JobResult,
    Runner,
)
from embedfresh.operators.runners.local import LocalRunner
from embedfresh.operators.runners.registry import (
    RegisteredRunner,
    register_runner,
    registered_runner,
    registered_runners,
    unregister_runner,
)

# The built-in execution modes, one line each (ExecutionMode names them).
register_runner(ExecutionMode.LOCAL, "embedfresh.operators.runners.local:LocalRunner")
register_runner(
    ExecutionMode.AWS_BATCH,
    "embedfresh.operators.runners.aws_batch:AwsBatchRunner.from_settings",
    required_settings="batch={'job_definition': ..., 'job_queue': ...}",
)

__all__ = [
    "AttachingRunner",
    "AwsBatchRunner",
    "BatchSettings",
    "DeferrableRunner",
    "JobResult",
    "LocalRunner",
    "RegisteredRunner",
    "Runner",
    "register_runner",
    "registered_runner",
    "registered_runners",
    "unregister_runner",
]
