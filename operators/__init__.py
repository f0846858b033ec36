"""Airflow operators for the embedfresh jobs: ``from operators import IncrementalTrainingOperator``.

Nothing here imports torch, torch_xla, boto3 or transformers at module level: the jobs
run in their own processes (ruff TID253 keeps it so).
"""

from operators.base import EmbedfreshJobOperator
from operators.constants import ExecutionMode
from operators.evaluate import EvaluationOperator
from operators.gate import QualityGateOperator
from operators.job_spec import JobSpec
from operators.promote import MODEL_PROMOTIONS_ALIAS, PromoteModelOperator, model_asset
from operators.runners import AwsBatchRunner, BatchSettings, JobResult, LocalRunner
from operators.train import IncrementalTrainingOperator

__all__ = [
    "MODEL_PROMOTIONS_ALIAS",
    "AwsBatchRunner",
    "BatchSettings",
    "EmbedfreshJobOperator",
    "EvaluationOperator",
    "ExecutionMode",
    "IncrementalTrainingOperator",
    "JobResult",
    "JobSpec",
    "LocalRunner",
    "PromoteModelOperator",
    "QualityGateOperator",
    "model_asset",
]
