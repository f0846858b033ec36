"""Job configs: pydantic models read from JSON/YAML and ``--set key=value``, validated
before a job's first write. Torch-free, so the control plane can build and check them.

:mod:`~embedfresh.core.config.base` holds what every job shares (:class:`JobConfig`,
:func:`load_config`); one module per family of jobs holds their configs.
"""

from embedfresh.core.config.base import JobConfig, load_config, parse_override
from embedfresh.core.config.embedding import EmbedConfig, ExportConfig
from embedfresh.core.config.evaluation import (
    EvaluateConfig,
    GateConfig,
    ImportLabelsConfig,
    PublishModelConfig,
)
from embedfresh.core.config.health import HealthConfig
from embedfresh.core.config.release import (
    AnnConfig,
    CorpusDiffConfig,
    CorpusSyncConfig,
    GarbageCollectConfig,
    IndexAttachConfig,
    IndexLoadConfig,
    ReleaseConfig,
    RollbackConfig,
    SearchCheckConfig,
    SearchConfig,
)
from embedfresh.core.config.training import (
    DEFAULT_NEURON_CC_FLAGS,
    CompileConfig,
    ParityConfig,
    TrainConfig,
)

__all__ = [
    "DEFAULT_NEURON_CC_FLAGS",
    "AnnConfig",
    "CorpusDiffConfig",
    "CorpusSyncConfig",
    "GarbageCollectConfig",
    "IndexAttachConfig",
    "IndexLoadConfig",
    "ReleaseConfig",
    "SearchCheckConfig",
    "SearchConfig",
    "CompileConfig",
    "EmbedConfig",
    "EvaluateConfig",
    "ExportConfig",
    "GateConfig",
    "HealthConfig",
    "ImportLabelsConfig",
    "JobConfig",
    "ParityConfig",
    "PublishModelConfig",
    "RollbackConfig",
    "TrainConfig",
    "load_config",
    "parse_override",
]
