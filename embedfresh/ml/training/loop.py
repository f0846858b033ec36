"""The training loop: steps from where a :class:`~embedfresh.ml.training.state.TrainState`
stands to the end of the plan, with logging, evaluation points and checkpoints.

One step: forward (``model.score_and_embed``, compiled or data parallel or not) under
the backend's autocast, relevance loss plus in-batch contrastive loss (the contrastive
term alone on positive pairs: the relevance loss is weighted 0), backward,
gradient clipping, optimizer and schedule step. The backend's hooks sit at fixed places
so the same loop runs eagerly on CPU/CUDA and traced on XLA.

SIGTERM (AWS Batch, a Spot reclaim, Airflow's ``on_kill``) does not cut a step: the
loop finishes the step in progress, every rank stops at that step, a committed
checkpoint of it is written when the grace period allows, and the job exits 75 so its
retry resumes from that step (:mod:`embedfresh.ml.training.preemption`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embedfresh.core.config import TrainConfig
from embedfresh.core.exit_codes import BadInputError, TransientError
from embedfresh.core.progress import Progress
from embedfresh.ml.backends import Backend
from embedfresh.ml.checkpoint import CheckpointManager, cpu_state_dict
from embedfresh.ml.model.relevance import RelevanceModel, in_batch_contrastive
from embedfresh.ml.parallel.sharding import sharded_state
from embedfresh.ml.training.data import RankBatches, TrainingSet
from embedfresh.ml.training.eval_points import EvalPoints
from embedfresh.ml.training.plan import TrainPlan
from embedfresh.ml.training.preemption import Preemption, Stop, grace_seconds
from embedfresh.ml.training.state import TrainState, checkpoint_state, kernel_route, rng_state

# The train job's logger: its log lines read the same wherever the code lives (tests
# and operators wait for "step N/M", "checkpoint step N committed" and "SIGTERM: stopped
# after step N/M").
log = logging.getLogger("embedfresh.jobs.train")

#: Steps of an attempt that may trace new graphs: the first one traces forward+backward
#: and the optimizer's state initialisation (a one-off graph on XLA), the second the
#: steady-state update. Any compilation after them is a recompile (``compiles_after_warmup``).
WARMUP_STEPS = 2

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class ScoreAndEmbed(torch.nn.Module):
    """``model.score_and_embed`` as a module's forward, so DistributedDataParallel (which
    hooks ``forward``) can wrap the training step."""

    def __init__(self, model: RelevanceModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.model.score_and_embed(*args)


@dataclass(frozen=True)
class LoopStats:
    """What one call of :meth:`Trainer.run` measured.

    :param seconds: wall time of the call, evaluation points included.
    :param first_step_seconds: from the call's start to the end of its first step
        (compilation included); None when it ran no step.
    :param compiles_after_warmup: graph compilations after the call's first
        :data:`WARMUP_STEPS` steps, the evaluation points' own not counted (0 with
        fixed shapes).
    """

    seconds: float
    first_step_seconds: float | None
    compiles_after_warmup: int


@dataclass
class Trainer:
    """The parts of a training step, built once, and the loop over them.

    :param forward: ``model.score_and_embed``, possibly wrapped (data parallel,
        ``torch.compile``); ``model`` is the module whose parameters it trains.
    :param checkpoints: offered every step; it decides which ones it saves.
    :param evaluator: evaluation points (rank 0 with ``eval_every`` set; every rank when
        sharded, rank 0 writing), else None.
    :param sharded: the model is sharded over the ranks (fsdp, hsdp): every rank writes
        its shards of each checkpoint (:meth:`CheckpointManager.save_sharded`).
    :param pointwise: the data has negatives (binary or graded labels) and the relevance
        head learns from them; positive pairs alone train the contrastive term only (the
        relevance loss stays in the graph at weight 0, so every parameter takes part in
        the step, as data parallel and sharding require).
    """

    cfg: TrainConfig
    backend: Backend
    model: RelevanceModel
    forward: Forward
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    data: TrainingSet
    plan: TrainPlan
    checkpoints: CheckpointManager
    evaluator: EvalPoints | None = None
    sharded: bool = False
    pointwise: bool = True

    def run(self, state: TrainState, until: int | None = None) -> LoopStats:
        """Train from ``state.step`` to ``until`` (default: the plan's total), advancing
        ``state`` step by step; the loss is recorded every ``log_every`` steps, at each
        checkpoint and at the end of the plan.

        A SIGTERM ends the call at the end of the step in progress (the same step on
        every rank), with a committed checkpoint of that step when the grace period
        leaves room for one; one during the plan's last step lets the run finish.

        :raises BadInputError: the loss is not finite (nothing of that step is saved).
        :raises TransientError: stopped by SIGTERM (exit 75: the retry resumes).
        """
        backend, total = self.backend, self.plan.total
        last = total if until is None else until
        first = state.step
        started = time.perf_counter()
        first_step_seconds = None
        # neuron_parallel_compile's trial extracts graphs and runs none: its values are junk.
        extracting = bool(os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY"))
        self.model.train()
        loss_fn = torch.nn.BCEWithLogitsLoss()
        batches = self._batches(first, last)
        compiles_at_warmup, eval_compiles_at_warmup = None, 0
        progress = Progress(f"training {self.cfg.model}", last - first, unit="steps", log=log)
        preemption, gather = self._preemption()
        with preemption or contextlib.nullcontext():
            for step, batch in zip(range(first, last), batches, strict=False):
                done = step + 1
                loss = self._forward_backward(batch, loss_fn)
                if done % self.cfg.log_every == 0 or done == total or self.checkpoints.due(done):
                    # Eager: now. XLA: at the sync below, once the loss is materialised, so
                    # reading it never cuts the step's graph (and a NaN stops before the
                    # update).
                    epoch = step // self.plan.per_epoch
                    backend.after_step(self._record, state, extracting, loss, done, epoch)
                backend.mark_step()
                backend.optimizer_step(self.optimizer)
                self.schedule.step()
                backend.mark_step()
                state.step = done
                progress.advance(1)
                if first_step_seconds is None:
                    first_step_seconds = time.perf_counter() - started
                if done - first == WARMUP_STEPS:
                    compiles_at_warmup = backend.compiles()
                    eval_compiles_at_warmup = (
                        0 if self.evaluator is None else self.evaluator.compiles
                    )
                if self.evaluator is not None and self.evaluator.due(done, total):
                    self.evaluator(self.model, done, self.cfg.output_version)
                url = None
                checkpointed = self.checkpoints.due(done, last_step=done == total)
                if checkpointed:
                    url = self._checkpoint(state, preemption)
                if preemption is not None and done < total:
                    stop = preemption.decide(gather)  # every rank, every step: a collective
                    if stop is not None:
                        self._stop(state, stop, preemption, checkpointed, url)
            if preemption is not None and preemption.requested and state.step == total:
                log.warning(
                    "SIGTERM during the last step (%d/%d): the run finishes and publishes",
                    total,
                    total,
                )
        progress.finish()
        after = 0 if compiles_at_warmup is None else backend.compiles() - compiles_at_warmup
        if self.evaluator is not None and compiles_at_warmup is not None:
            after -= self.evaluator.compiles - eval_compiles_at_warmup  # evaluation's own graphs
        return LoopStats(time.perf_counter() - started, first_step_seconds, after)

    def _batches(self, first: int, last: int) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's batches of steps ``first`` to ``last``, through the backend's loader."""
        backend = self.backend
        return backend.loader(
            RankBatches(
                self.data,
                self.cfg.seed,
                self.plan.per_epoch,
                self.plan.batch_size,
                backend.rank,
                backend.world_size,
                first,
                last,
                trim=not backend.static_shapes,
            )
        )

    def _forward_backward(
        self, batch: dict[str, torch.Tensor], loss_fn: torch.nn.Module
    ) -> torch.Tensor:
        """The step's loss, its gradients computed and clipped (not yet applied)."""
        cfg = self.cfg
        with self.backend.autocast():
            logits, q, p = self.forward(
                batch["query_ids"],
                batch["query_mask"],
                batch["product_ids"],
                batch["product_mask"],
                batch["features"],
            )
            loss = loss_fn(logits.float(), batch["labels"])
            if not self.pointwise:
                loss = loss * 0.0
            if cfg.contrastive_weight:
                loss = loss + cfg.contrastive_weight * in_batch_contrastive(
                    q, p, batch["labels"], cfg.contrastive_temperature
                )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        return loss

    def _record(
        self, state: TrainState, extracting: bool, loss: torch.Tensor, done: int, epoch: int
    ) -> None:
        value = float(loss.detach().to("cpu"))
        if not np.isfinite(value) and not extracting:
            raise BadInputError(
                f"loss is {value} at step {done}: training diverged (lower the learning "
                "rate or check the data); no checkpoint or model was written for it"
            )
        state.loss_curve.append([done, round(value, 6)])
        log.info("step %d/%d epoch %d loss %.4f", done, self.plan.total, epoch, value)

    def _checkpoint(
        self, state: TrainState, preemption: Preemption | None = None, force: bool = False
    ) -> str | None:
        """Save the checkpoint of ``state.step`` (rank 0 writes, and every rank its shards
        when sharded; every rank gives its RNG state, gathered for a bit-exact resume of
        each rank's dropout stream); its URL on rank 0, None on the others. ``force``:
        off the interval (a SIGTERM's step)."""
        backend = self.backend
        started = time.perf_counter()
        rngs = backend.gather(rng_state(backend))
        meta = {
            **state.meta(evaluating=self.evaluator is not None),
            "kernels": kernel_route(backend),
            "parallelism": self.cfg.parallelism,
            "world_size": backend.world_size,
            "global_batch": self.plan.samples_per_step,
        }
        url = None
        if self.sharded:
            shards, param_groups = sharded_state(self.model, self.optimizer)
            extra = checkpoint_state(
                {"param_groups": param_groups}, self.schedule, rngs, backend.world_size
            )
            url = self.checkpoints.save_sharded(
                state.step,
                shards,
                extra,
                meta,
                rank=backend.rank,
                gather=backend.gather,
                force=force,
            )
        elif backend.is_main:
            extra = checkpoint_state(
                self.optimizer.state_dict(), self.schedule, rngs, backend.world_size
            )
            url = self.checkpoints.save(
                state.step, cpu_state_dict(self.model), extra, meta, force=force
            )
        if url is not None:
            log.info("checkpoint step %d committed at %s", state.step, url)
        if preemption is not None:
            preemption.wrote_checkpoint(time.perf_counter() - started)
        return url

    def _preemption(self) -> tuple[Preemption | None, Callable[[Any], list[Any]] | None]:
        """The SIGTERM handler of this call and the gather its decisions go through
        (None on one process). None when the backend cannot gather over its ranks
        (torch-xla data parallel): SIGTERM then ends the process as before."""
        backend = self.backend
        if backend.world_size > 1 and len(backend.gather(None)) != backend.world_size:
            log.warning(
                "backend %s cannot gather over its %d ranks: SIGTERM is not caught (it ends "
                "the process; the retry resumes from the last interval checkpoint)",
                backend.name,
                backend.world_size,
            )
            return None, None
        gather = backend.gather if backend.world_size > 1 else None
        return Preemption(grace_seconds()), gather

    def _stop(
        self,
        state: TrainState,
        stop: Stop,
        preemption: Preemption,
        checkpointed: bool,
        url: str | None,
    ) -> None:
        """End the loop at ``state.step`` after a SIGTERM: checkpoint that step unless
        it already is (``checkpointed``, at ``url``) and if the grace period allows, then
        raise. Every rank comes here at the same step with the same ``stop``."""
        decided = time.perf_counter()
        done, total = state.step, self.plan.total
        if not checkpointed and stop.checkpoint:
            url = self._checkpoint(state, preemption, force=True)
            checkpointed = True
        if checkpointed and self.backend.world_size > 1:
            # Rank 0's URL, once it is committed: no rank exits before the checkpoint is.
            url = self.backend.gather(url)[0]
        waited = stop.waited + time.perf_counter() - decided  # since the earliest SIGTERM
        if checkpointed:
            where = f"at {url}" if url is not None else "by rank 0"
            log.warning(
                "SIGTERM: stopped after step %d/%d; checkpoint step %d committed %s; "
                "%.2f s since the signal (grace %.0f s; SIGTERMs received here: %d); "
                "exiting 75, the retry resumes from step %d",
                done,
                total,
                done,
                where,
                waited,
                stop.grace,
                preemption.signals,
                done,
            )
            raise TransientError(
                f"stopped by SIGTERM after step {done}/{total}; checkpoint step {done} "
                f"committed {where}: the retry resumes from step {done}"
            )
        log.warning(
            "SIGTERM: stopped after step %d/%d without a checkpoint of it: %.2f s of the "
            "%.0f s grace period spent and a checkpoint write took up to %.2f s; exiting "
            "75, the retry resumes from the last committed checkpoint",
            done,
            total,
            stop.waited,
            stop.grace,
            stop.slowest_write,
        )
        raise TransientError(
            f"stopped by SIGTERM after step {done}/{total} without a checkpoint of it (no "
            f"time left in the {stop.grace:.0f} s grace period): the retry resumes from "
            "the last committed checkpoint"
        )
