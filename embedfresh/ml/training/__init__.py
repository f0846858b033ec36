"""Training an embedding model on one data interval, piece by piece; the train job
(:mod:`embedfresh.jobs.train`) and the compile job's trial are built from it.

- :mod:`~embedfresh.ml.training.run`: :class:`TrainingRun`, one config run end to end
  (open and check, fit, publish, report);
- :mod:`~embedfresh.ml.training.plan`: steps per epoch, total steps, the config hash a
  checkpoint must carry to be resumed;
- :mod:`~embedfresh.ml.training.data`: the interval's tensors and each rank's batches,
  in an order that is a pure function of (seed, epoch);
- :mod:`~embedfresh.ml.training.init`: start weights (``init``), dropout, the compile
  environment;
- :mod:`~embedfresh.ml.training.optim`: AdamW and the learning-rate schedule;
- :mod:`~embedfresh.ml.training.state`: :class:`TrainState`, the loop's state in one
  object, and the RNG states that make a resume bit-exact;
- :mod:`~embedfresh.ml.training.loop`: :class:`Trainer`, the step and the loop;
- :mod:`~embedfresh.ml.training.preemption`: SIGTERM noted, the step finished, a
  checkpoint of it and exit 75 (every rank stopping at the same step);
- :mod:`~embedfresh.ml.training.eval_points`: evaluation during training.

When and which checkpoints are saved, kept and resumed is the checkpoint manager's
policy (:class:`embedfresh.ml.checkpoint.CheckpointManager`).
"""

from embedfresh.ml.training.data import RankBatches, TrainingSet, data_fingerprint, epoch_order
from embedfresh.ml.training.eval_points import EvalPoints
from embedfresh.ml.training.init import prepare_compile, resolve_init, set_dropout
from embedfresh.ml.training.loop import WARMUP_STEPS, LoopStats, ScoreAndEmbed, Trainer
from embedfresh.ml.training.optim import make_optimizer, make_schedule
from embedfresh.ml.training.plan import TrainPlan, config_hash
from embedfresh.ml.training.run import Fitted, TrainingRun
from embedfresh.ml.training.state import (
    TrainState,
    checkpoint_state,
    restore_checkpoint_state,
    rng_state,
    set_rng_state,
)

__all__ = [
    "WARMUP_STEPS",
    "EvalPoints",
    "Fitted",
    "LoopStats",
    "RankBatches",
    "ScoreAndEmbed",
    "TrainPlan",
    "TrainState",
    "Trainer",
    "TrainingRun",
    "TrainingSet",
    "checkpoint_state",
    "config_hash",
    "data_fingerprint",
    "epoch_order",
    "make_optimizer",
    "make_schedule",
    "prepare_compile",
    "resolve_init",
    "restore_checkpoint_state",
    "rng_state",
    "set_dropout",
    "set_rng_state",
]
