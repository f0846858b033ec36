"""Backend parity: the same start version trained on two backends, curves gated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedfresh.operators.train import IncrementalTrainingOperator


class BackendParityOperator(IncrementalTrainingOperator):
    """Trains ``init_version`` on ``backend_a`` and ``backend_b`` with identical
    hyperparameters and gates B's evaluation curve against A's in parity mode
    (``python -m embedfresh.jobs.parity``). Anything but PASS exits 3: the task fails without retry.

    Takes the training operator's arguments (data interval, epochs, ...); ``backend`` is
    unused.

    :param init_version: model version both sides start from; empty: the registry's
        production version, read when the task runs (templated).
    :param backend_a: reference backend (templated).
    :param backend_b: candidate backend (templated).
    :param eval_every: optimizer steps between evaluations, the curve's points (templated).
    """

    job_name = "parity"
    template_fields: Sequence[str] = (
        *IncrementalTrainingOperator.template_fields,
        "init_version",
        "backend_a",
        "backend_b",
        "eval_every",
    )

    def __init__(
        self,
        *,
        init_version: str = "",
        backend_a: str = "cpu",
        backend_b: str = "xla",
        eval_every: int | str = 50,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.init_version = init_version
        self.backend_a = backend_a
        self.backend_b = backend_b
        self.eval_every = eval_every

    def job_specific_settings(self) -> dict[str, Any]:
        init_version = self.init_version
        if not init_version:
            from embedfresh.operators.registry import production_version

            init_version = production_version(self.artifact_root, self.model)
        return {
            **super().job_specific_settings(),
            "init_version": init_version,
            "backend_a": self.backend_a,
            "backend_b": self.backend_b,
            "eval_every": self.eval_every,
        }
