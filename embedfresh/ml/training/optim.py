"""The optimizer and learning-rate schedule of a training run."""

from __future__ import annotations

import torch

from embedfresh.core.config import TrainConfig
from embedfresh.ml.model.relevance import RelevanceModel


def make_optimizer(
    model: RelevanceModel, cfg: TrainConfig, incremental: bool
) -> torch.optim.Optimizer:
    """AdamW with the config's learning rates, scaled down when continuing from a trained
    model: at the full rate a refresh forgets more than it learns (measured on the demo,
    day 2 from day 1: recall@10 0.048 at 1e-3 vs 0.061 at 1e-4, day 1 had 0.057).

    Reads ``learning_rate``, ``incremental_lr_scale`` and ``weight_decay`` of ``cfg``.
    """
    spec = model.spec
    scale = cfg.incremental_lr_scale if incremental else 1.0
    encoder_lr = (cfg.learning_rate or spec.encoder_learning_rate) * scale
    head_lr = (cfg.learning_rate or spec.head_learning_rate) * scale
    # Not fused=True, though it is 2.8x (tiny) and 6.7x (minilm) faster per CPU optimizer
    # step (docs/BENCHMARKS.md): a checkpoint of a fused-AdamW cpu run then fails to resume
    # on xla ("mutating a non-functional tensor with a functional tensor", torch-xla 2.9;
    # tests/test_xla_backend.py), and the interchange matters more than ~10% of a step.
    return torch.optim.AdamW(
        [
            {"params": model.encoder.parameters(), "lr": encoder_lr},
            {"params": model.head.parameters(), "lr": head_lr},
        ],
        weight_decay=cfg.weight_decay,
    )


def make_schedule(
    optimizer: torch.optim.Optimizer, warmup: int, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up then linear decay to 10% of the peak."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.1, 1.0 - 0.9 * (step - warmup) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
