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
    PromoteAnywayConfig,
    PromoteConfig,
    PublishModelConfig,
    RollbackConfig,
)
from embedfresh.core.config.health import HealthConfig
from embedfresh.core.config.training import (
    DEFAULT_NEURON_CC_FLAGS,
    CompileConfig,
    ParityConfig,
    TrainConfig,
)

__all__ = [
    "DEFAULT_NEURON_CC_FLAGS",
    "CompileConfig",
    "EmbedConfig",
    "EvaluateConfig",
    "ExportConfig",
    "GateConfig",
    "HealthConfig",
    "JobConfig",
    "ParityConfig",
    "PromoteConfig",
    "PublishModelConfig",
    "PromoteAnywayConfig",
    "RollbackConfig",
    "TrainConfig",
    "load_config",
    "parse_override",
]
