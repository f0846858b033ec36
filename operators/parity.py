"""Backend parity: the same start version trained on two backends, curves gated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedfresh.operators.train import IncrementalTrainingOperator


class BackendParityOperator(IncrementalTrainingOperator):
    """Trains ``init_version`` on ``backend_a`` and ``backend_b`` with identical
    hyperparameters and gates B's evaluation curve against A's in parity mode
    (``python -m embedfresh.jobs.parity``). Anything but PASS exits 3: the task fails without retry.
    Give the sides' tasks one ``init_version`` (resolved once, not each from production).

    Takes the training operator's arguments (data interval, epochs, ...); ``backend`` is
    unused.

    :param init_version: model version both sides start from; empty: the registry's
        production version, read when the task runs (templated).
    :param backend_a: reference backend (templated).
    :param backend_b: candidate backend (templated).
    :param eval_every: optimizer steps between evaluations, the curve's points (templated).
    :param step: ``all`` (both sides, then the gate, in one job), ``a`` or ``b`` (one
        side: a task, or an AWS Batch job, on that backend's machine), ``compare`` (the
        gate, once both sides trained: ``dags/accelerator_parity.py``).
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
        step: str = "all",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if step not in ("all", "a", "b", "compare"):
            raise ValueError(f"step is all, a, b or compare, got {step!r}")
        self.step = step
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
            "step": self.step,
        }
