"""Airflow operators for the embedfresh jobs: ``from embedfresh.operators import IncrementalTrainingOperator``.

Nothing here imports torch, torch_xla, boto3 or transformers at module level: the jobs
run in their own processes (ruff TID253 keeps it so).

The job operators (:class:`EmbedfreshJobOperator` and its kin) follow Airflow's
conventions: ``model`` is required and ``artifact_root`` defaults to the jobs' own
setting; settings are checked when the DAG file is parsed, or fail the task without
retry once rendered (:class:`SettingsError`); ``aws_conn_id`` and ``deferrable``
(default ``[operators] default_deferrable``) are operator arguments; the tasks link to
their AWS Batch job and to the "Model quality" page, and report OpenLineage datasets
when the OpenLineage provider is installed.
"""

from embedfresh.operators.assets import (
    EMBEDDING_PUBLICATIONS_ALIAS,
    MODEL_PROMOTIONS_ALIAS,
    corpus_asset,
    embeddings_asset,
    model_asset,
)
from embedfresh.operators.base import EmbedfreshJobOperator, SettingsError
from embedfresh.operators.compile import AheadOfTimeCompileOperator
from embedfresh.operators.constants import ExecutionMode
from embedfresh.operators.embed import (
    BatchArrayEmbeddingOperator,
    BatchEmbeddingOperator,  # deprecated alias of ShardEmbeddingOperator, for one release
    CorporaOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    ResolveModelVersionOperator,
    ShardEmbeddingOperator,
)
from embedfresh.operators.evaluate import EvaluationOperator
from embedfresh.operators.gate import QualityGateOperator
from embedfresh.operators.health import AcceleratorHealthOperator
from embedfresh.operators.job_spec import JobSpec
from embedfresh.operators.parity import BackendParityOperator
from embedfresh.operators.registry import production_version
from embedfresh.operators.release import (
    CorpusSyncOperator,
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
    LinkingRunner,
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
    "BatchEmbeddingOperator",  # deprecated alias of ShardEmbeddingOperator, for one release
    "BatchSettings",
    "CorporaOperator",
    "CorpusSyncOperator",
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
    "LinkingRunner",
    "LocalRunner",
    "QualityGateOperator",
    "ReleaseOperator",
    "ResolveModelVersionOperator",
    "RollbackOperator",
    "Runner",
    "SearchCheckOperator",
    "SettingsError",
    "ShardEmbeddingOperator",
    "VectorIndexOperator",
    "corpus_asset",
    "embeddings_asset",
    "model_asset",
    "production_version",
    "register_runner",
    "registered_runners",
    "unregister_runner",
]
