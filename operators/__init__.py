"""Airflow operators for the embedfresh jobs: ``from operators import IncrementalTrainingOperator``.

Nothing here imports torch, torch_xla, boto3 or transformers at module level: the jobs
run in their own processes (ruff TID253 keeps it so).
"""

from operators.assets import EMBEDDING_PUBLICATIONS_ALIAS, embeddings_asset
from operators.base import EmbedfreshJobOperator
from operators.compile import AheadOfTimeCompileOperator
from operators.constants import ExecutionMode
from operators.embed import (
    BatchEmbeddingOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    ResolveModelVersionOperator,
)
from operators.evaluate import EvaluationOperator
from operators.gate import QualityGateOperator
from operators.health import AcceleratorHealthOperator
from operators.job_spec import JobSpec
from operators.parity import BackendParityOperator
from operators.promote import MODEL_PROMOTIONS_ALIAS, PromoteModelOperator, model_asset
from operators.registry import production_version
from operators.runners import AwsBatchRunner, BatchSettings, JobResult, LocalRunner
from operators.train import IncrementalTrainingOperator

__all__ = [
    "AcceleratorHealthOperator",
    "AheadOfTimeCompileOperator",
    "EMBEDDING_PUBLICATIONS_ALIAS",
    "MODEL_PROMOTIONS_ALIAS",
    "AwsBatchRunner",
    "BackendParityOperator",
    "BatchEmbeddingOperator",
    "BatchSettings",
    "CorpusShardsOperator",
    "EmbedfreshJobOperator",
    "EmbeddingVerifyOperator",
    "EvaluationOperator",
    "ExecutionMode",
    "IncrementalTrainingOperator",
    "JobResult",
    "JobSpec",
    "LocalRunner",
    "PromoteModelOperator",
    "QualityGateOperator",
    "ResolveModelVersionOperator",
    "embeddings_asset",
    "model_asset",
    "production_version",
]
