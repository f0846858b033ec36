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
    LinkingRunner,
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

# The built-in execution modes, one line each (ExecutionMode names them). Their settings
# models are imported above already, so operators check settings when a DAG file parses.
register_runner(
    ExecutionMode.LOCAL, "embedfresh.operators.runners.local:LocalRunner", settings=LocalRunner
)
register_runner(
    ExecutionMode.AWS_BATCH,
    "embedfresh.operators.runners.aws_batch:AwsBatchRunner.from_settings",
    required_settings="batch={'job_definition': ..., 'job_queue': ...}",
    settings=BatchSettings,
)

__all__ = [
    "AttachingRunner",
    "AwsBatchRunner",
    "BatchSettings",
    "DeferrableRunner",
    "JobResult",
    "LinkingRunner",
    "LocalRunner",
    "RegisteredRunner",
    "Runner",
    "register_runner",
    "registered_runner",
    "registered_runners",
    "unregister_runner",
]
