"""Airflow operators for the embedfresh jobs: ``from embedfresh.operators import IncrementalTrainingOperator``.

Nothing here imports torch, torch_xla, boto3 or transformers at module level: the jobs
run in their own processes (ruff TID253 keeps it so).
"""

from embedfresh.operators.assets import (
    EMBEDDING_PUBLICATIONS_ALIAS,
    MODEL_PROMOTIONS_ALIAS,
    embeddings_asset,
    model_asset,
)
from embedfresh.operators.base import EmbedfreshJobOperator
from embedfresh.operators.compile import AheadOfTimeCompileOperator
from embedfresh.operators.constants import ExecutionMode
from embedfresh.operators.embed import (
    BatchArrayEmbeddingOperator,
    BatchEmbeddingOperator,
    CorporaOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    ResolveModelVersionOperator,
)
from embedfresh.operators.evaluate import EvaluationOperator
from embedfresh.operators.gate import QualityGateOperator
from embedfresh.operators.health import AcceleratorHealthOperator
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.parity import BackendParityOperator
from embedfresh.operators.registry import production_version
from embedfresh.operators.release import (
    GarbageCollectOperator,
    IndexLoadOperator,
    ReleaseOperator,
    RollbackOperator,
    SearchCheckOperator,
    VectorIndexOperator,
)
from embedfresh.operators.runners import (
    AwsBatchRunner,
    BatchSettings,
    JobResult,
    LocalRunner,
    Runner,
    register_runner,
    registered_runners,
    unregister_runner,
)
from embedfresh.operators.train import IncrementalTrainingOperator

__all__ = [
    "AcceleratorHealthOperator",
    "AheadOfTimeCompileOperator",
    "EMBEDDING_PUBLICATIONS_ALIAS",
    "MODEL_PROMOTIONS_ALIAS",
    "AwsBatchRunner",
    "BackendParityOperator",
    "BatchArrayEmbeddingOperator",
    "BatchEmbeddingOperator",
    "BatchSettings",
    "CorporaOperator",
    "CorpusShardsOperator",
    "EmbedfreshJobOperator",
    "EmbeddingVerifyOperator",
    "EvaluationOperator",
    "ExecutionMode",
    "GarbageCollectOperator",
    "IncrementalTrainingOperator",
    "IndexLoadOperator",
    "JobResult",
    "JobSpec",
    "LocalRunner",
    "QualityGateOperator",
    "ReleaseOperator",
    "ResolveModelVersionOperator",
    "RollbackOperator",
    "Runner",
    "SearchCheckOperator",
    "VectorIndexOperator",
    "embeddings_asset",
    "model_asset",
    "production_version",
    "register_runner",
    "registered_runners",
    "unregister_runner",
]
