"""One training config run on this process, step by step: :class:`TrainingRun`.

The train job (:mod:`embedfresh.jobs.train`) tells the whole story with it; the compile
job's in-process trial (``torch.compile``) opens and fits one too, so both train with
the very same code:

- :meth:`TrainingRun.open`: store, backend and data opened, the plan made and
  everything checked before the first write (a context manager: leaving it, normally or
  by an error, leaves the process group);
- :meth:`TrainingRun.published_report`: a retry after the version was published has
  nothing to train;
- :meth:`TrainingRun.fit`: the model with its start weights, or the newest valid
  checkpoint's weights and state, then the loop to the end of the plan;
- :meth:`TrainingRun.publish` and :meth:`TrainingRun.report`: the model version and
  the train report (rank 0).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

from embedfresh.core import layout
from embedfresh.core.config import TrainConfig
from embedfresh.core.cost import run_cost
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.memory import return_freed_tensors, rss_mib
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.backends import Backend, get_backend, sharding_refusal
from embedfresh.ml.checkpoint import SHARDED, Checkpoint, CheckpointManager, cpu_state_dict
from embedfresh.ml.compile import modes, resolve_backend
from embedfresh.ml.data.judgments import pairs_corpus
from embedfresh.ml.data.reader import Examples, read_train
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import ModelSpec
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.tokenizer import TextTokenizer
from embedfresh.ml.parallel.sharding import (
    Sharding,
    checkpoint_blocks,
    full_weights,
    load_sharded_state,
    local_tensor_bytes,
    sharded_state,
)
from embedfresh.ml.training.data import TrainingSet
from embedfresh.ml.training.eval_points import EvalPoints
from embedfresh.ml.training.init import prepare_compile, resolve_init, set_dropout
from embedfresh.ml.training.loop import Forward, LoopStats, ScoreAndEmbed, Trainer
from embedfresh.ml.training.optim import make_optimizer, make_schedule
from embedfresh.ml.training.plan import TrainPlan
from embedfresh.ml.training.state import (
    TrainState,
    kernel_route,
    restore_checkpoint_state,
    route_changes,
    seed_streams,
)

# The train job's logger: its log lines read the same wherever the code lives (tests
# wait for "resuming from ... (step N)").
log = logging.getLogger("embedfresh.jobs.train")


@dataclass(frozen=True)
class Fitted:
    """A run's training done on this rank.

    :param first_step: the step this attempt started from (0, or the checkpoint's).
    :param resumed_from: ``{step, url, kernels_changed}`` of the checkpoint it resumed
        from (``kernels_changed``: what differs from its kernel route; a sharded resume
        under another world size adds ``world_size_changed``), else None.
    :param tensor_bytes: every rank's bytes of weights, gradients and optimizer state at
        the end (:func:`~embedfresh.ml.parallel.sharding.local_tensor_bytes`), rank order.
    """

    model: RelevanceModel
    state: TrainState
    first_step: int
    resumed_from: dict[str, Any] | None
    stats: LoopStats
    evaluator: EvalPoints | None
    tensor_bytes: list[dict[str, int]]

    @property
    def steps_run(self) -> int:
        return self.state.step - self.first_step


@dataclass(eq=False)
class TrainingRun:
    """One training config on this process; build it with :meth:`open`.

    :param backend_name: the resolved backend (``auto`` decided), priced in the report.
    :param compile_info: the report's ``compile`` section (:func:`prepare_compile`).
    :param started: ``time.perf_counter()`` when :meth:`open` began (``wall_seconds``).
    :param sharding: the plan of a sharded run (``parallelism`` fsdp or hsdp), else None.
    """

    cfg: TrainConfig
    store: ArtifactStore
    spec: ModelSpec
    tokenizer_json: bytes
    backend: Backend
    backend_name: str
    compile_info: dict[str, Any]
    examples: Examples
    plan: TrainPlan
    started: float
    sharding: Sharding | None = None

    @classmethod
    def open(cls, cfg: TrainConfig) -> TrainingRun:
        """Open the store, prepare compilation, start the backend (joining torchrun's
        process group), read the data interval and make the plan; rank 0 proves the
        run's folder writable. Nothing is written before all of this passed.

        :raises BadInputError: unknown instance type or backend, missing data, fewer
            rows than one batch, a parallelism the launch or backend cannot run, a
            checkpoint of this run id from another parallelism or global batch, or
            anything else the config gets wrong.
        """
        started = time.perf_counter()
        store = ArtifactStore(cfg.artifact_root)
        spec, tokenizer_json = versions.training_spec(store, cfg.model, cfg.dataset, cfg.features)
        backend_name = resolve_backend(cfg.backend)
        run_cost(backend_name, 0.0, cfg.instance_type, cfg.instance_prices)  # bad type: fail now
        if cfg.parallelism != "ddp" and (refusal := sharding_refusal(backend_name)):
            raise BadInputError(refusal)
        compile_info = prepare_compile(cfg, backend_name)
        backend = get_backend(backend_name)
        try:
            sharding = Sharding.plan(
                cfg.parallelism,
                backend.world_size,
                backend.device.type,
                shard_size=cfg.shard_size,
                mixed_precision=cfg.mixed_precision,
            )
            examples = read_train(
                store, cfg.dataset, cfg.data_interval_start, cfg.interval_end, spec.features,
                pairs_corpus(store, cfg.dataset), cfg.max_missing_documents,
            )  # fmt: skip
            if examples.kind == "positive" and not cfg.contrastive_weight:
                raise BadInputError(
                    f"{examples.sources[0]} holds positive pairs only (no label or grade "
                    "column), which train the contrastive term alone, and contrastive_weight "
                    "is 0: set it above 0 (the default is 1)"
                )
            plan = TrainPlan.make(cfg, spec, examples, backend.world_size)
            _check_resumable(store, cfg, plan)
            if backend.is_main:
                _check_writable(store, cfg)
        except BaseException:
            backend.stop_distributed()
            raise
        return cls(
            cfg=cfg,
            store=store,
            spec=spec,
            tokenizer_json=tokenizer_json,
            backend=backend,
            backend_name=backend_name,
            compile_info=compile_info,
            examples=examples,
            plan=plan,
            started=started,
            sharding=sharding,
        )

    def close(self) -> None:
        """Leave the process group (data parallel); a no-op on one process."""
        self.backend.stop_distributed()

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def report_rel(self) -> str:
        """Where the train report goes, relative to the store's root."""
        return layout.report(self.cfg.model, self.cfg.run_id, "train")

    @property
    def report_url(self) -> str:
        return self.store.url(self.report_rel)

    @property
    def version_url(self) -> str:
        """Where this run's model version is published."""
        return self.store.url(layout.model_version(self.cfg.model, self.cfg.output_version))

    def published_report(self) -> dict[str, Any] | None:
        """The stored train report when this run already published its version (a
        retry after success: nothing to train), else None.

        :raises BadInputError: the version exists from another configuration.
        """
        cfg = self.cfg
        published = versions.is_committed(self.store, cfg.model, cfg.output_version)
        if published is None:
            return None
        if published.get("config_hash") != self.plan.config_hash:
            raise BadInputError(
                f"model version {cfg.output_version} of {cfg.model} already exists from "
                "another configuration; versions are immutable (set another version)"
            )
        log.info("version %s already published by this run: nothing to train", cfg.output_version)
        if not self.store.exists(self.report_rel):
            # Only a version published before the report was written first (an older
            # embedfresh) lacks it: rebuild what the version itself records.
            log.warning("%s is missing: rebuilt from the version's model.json", self.report_url)
            meta = versions.version_meta(self.store, cfg.model, cfg.output_version)
            report = {
                "status": "ok",
                "model": cfg.model,
                "run_id": cfg.run_id,
                "version": cfg.output_version,
                "version_url": self.version_url,
                "rebuilt_from_version": True,
                **{k: meta.get(k) for k in ("init", "steps", "data_interval", "config_hash")},
            }
            self.store.write_json(self.report_rel, report)
            return report
        return self.store.read_json(self.report_rel)

    def fit(self) -> Fitted:
        """Build the model, start it from the newest valid checkpoint of this run id
        (weights, optimizer, schedule, RNG: bit-exact) or from ``cfg.init``'s weights,
        and train it to the end of the plan, checkpointing as the manager decides."""
        cfg, backend, plan = self.cfg, self.backend, self.plan
        if return_freed_tensors():
            log.info(
                "malloc: blocks of 4 MiB and more are mapped on their own, so each step's "
                "freed activations go back to the system (glibc mallopt M_MMAP_THRESHOLD)"
            )
        tokenizer = TextTokenizer(self.tokenizer_json, self.spec.max_length, self.spec.prompts)
        data = TrainingSet.build(self.examples, tokenizer)
        model = versions.build_model(self.spec, cfg.seed)
        checkpoints = CheckpointManager(
            self.store,
            cfg.model,
            cfg.run_id,
            cfg.keep_last,
            plan.config_hash,
            every=cfg.checkpoint_every,
        )
        checkpoint = checkpoints.load()  # the newest valid one, if any
        state = self._start_weights(model, checkpoint)
        if cfg.dropout is not None:
            set_dropout(model, cfg.dropout)
        if cfg.activation_checkpointing:
            log.info(
                "activation checkpointing: %d blocks recompute in backward",
                checkpoint_blocks(model),
            )
        if self.sharding is not None:
            self.sharding.apply(model, backend.device)  # each rank keeps its shard on the device
        else:
            model.to(backend.device)
        # A trained start (production or a pinned version) is fine-tuned at the scaled rate.
        trained_start = state.init["source"] in ("production", "version")
        optimizer = make_optimizer(model, cfg, incremental=trained_start)
        schedule = make_schedule(optimizer, cfg.warmup_steps, plan.total)
        self._resume(checkpoint, checkpoints, model, optimizer, schedule)
        evaluator = None
        # A sharded model runs only on every rank at once: each evaluates, rank 0 writes.
        if cfg.eval_every is not None and (backend.is_main or self.sharding is not None):
            evaluator = EvalPoints(
                cfg,
                self.store,
                backend,
                tokenizer,
                self.spec,
                self.tokenizer_json,
                state.eval_curve,
            )
        forward = self._forward(model)
        log.info("%s", padding_line(backend, data, self.spec.max_length))
        trainer = Trainer(
            cfg,
            backend,
            model,
            forward,
            optimizer,
            schedule,
            data,
            plan,
            checkpoints,
            evaluator,
            sharded=self.sharding is not None,
            pointwise=self.examples.kind != "positive",
        )
        first_step = state.step
        stats = trainer.run(state)
        resumed_from = None if checkpoint is None else self._resumed_from(checkpoint, first_step)
        tensor_bytes = backend.gather(local_tensor_bytes(model, optimizer))
        return Fitted(model, state, first_step, resumed_from, stats, evaluator, tensor_bytes)

    def _resume(
        self,
        checkpoint: Checkpoint | None,
        checkpoints: CheckpointManager,
        model: RelevanceModel,
        optimizer: torch.optim.Optimizer,
        schedule: torch.optim.lr_scheduler.LRScheduler,
    ) -> None:
        """The checkpoint's optimizer, schedule and RNG streams (a sharded one's weights
        and optimizer state resharded to this mesh), or fresh seeded streams."""
        cfg, backend = self.cfg, self.backend
        if checkpoint is None:
            # dropout stream independent of how init was reached; one per rank. Python's
            # and NumPy's too: checkpoints record them, so equal runs write equal bytes.
            seed_streams(cfg.seed, backend)
            return
        if checkpoint.sharded:
            shards, _ = sharded_state(model, optimizer)
            checkpoints.read_shards(checkpoint, shards)
            load_sharded_state(
                model, optimizer, shards, checkpoint.state["optimizer"]["param_groups"]
            )
        restore_checkpoint_state(checkpoint, optimizer, schedule, backend, cfg.seed)

    def _resumed_from(self, checkpoint: Checkpoint, first_step: int) -> dict[str, Any]:
        """What the report says of the checkpoint a run resumed from."""
        backend = self.backend
        resumed_from: dict[str, Any] = {
            "step": first_step,
            "url": checkpoint.url,
            # Non-empty: this run's weights are not bit-exact with an uninterrupted run.
            "kernels_changed": route_changes(checkpoint.meta.get("kernels"), kernel_route(backend)),
        }
        saved_by = checkpoint.meta.get("world_size", backend.world_size)
        if saved_by != backend.world_size:
            resumed_from["world_size_changed"] = [saved_by, backend.world_size]
        return resumed_from

    def _start_weights(self, model: RelevanceModel, checkpoint: Checkpoint | None) -> TrainState:
        """Load the checkpoint's weights into ``model``, or ``cfg.init``'s; the state
        training starts from."""
        plan = self.plan
        if checkpoint is not None:
            if checkpoint.weights is not None:  # a sharded one loads once the model is sharded
                model.load_state_dict(checkpoint.weights, strict=True)
            log.info("resuming from %s (step %d)", checkpoint.url, checkpoint.step)
            changes = route_changes(checkpoint.meta.get("kernels"), kernel_route(self.backend))
            if changes:
                log.warning(
                    "checkpoint step %d was written under other kernels (%s): this run's "
                    "weights will not be bit-exact with an uninterrupted run's. To restore "
                    "it, resume on the same device and torch with OMP_NUM_THREADS=%d "
                    "(or EMBEDFRESH_THREADS) as the interrupted attempt ran",
                    checkpoint.step,
                    ", ".join(changes),
                    checkpoint.meta["kernels"].get("threads", 1),
                )
            return TrainState.resume(checkpoint, plan.per_epoch, plan.samples_per_step)
        init = resolve_init(self.cfg, self.store, model)
        log.info("starting from %s", init)
        return TrainState(plan.per_epoch, plan.samples_per_step, init)

    def _forward(self, model: RelevanceModel) -> Forward:
        """``model.score_and_embed``, under DistributedDataParallel with several ranks
        (unless sharded: the sharded model gathers and reduces by itself) and under
        torch.compile in that compile mode."""
        forward: Forward = model.score_and_embed
        if self.backend.world_size > 1 and self.sharding is None:
            forward = self.backend.data_parallel(ScoreAndEmbed(model))
        if self.compile_info["mode"] == modes.TORCH_COMPILE:
            forward = self.backend.compile(forward)
        return forward

    def final_weights(self, fitted: Fitted) -> dict[str, torch.Tensor]:
        """The trained weights as CPU tensors on rank 0 (``{}`` on the others). Every rank
        calls it: a sharded model is gathered, one parameter at a time, to rank 0."""
        if self.sharding is not None:
            return full_weights(fitted.model)
        return cpu_state_dict(fitted.model) if self.backend.is_main else {}

    def publish(self, fitted: Fitted, weights: dict[str, torch.Tensor]) -> str:
        """Publish ``weights`` (:meth:`final_weights`) as model version
        ``cfg.output_version`` (rank 0), its COMMIT written last; returns its URL."""
        cfg = self.cfg
        return versions.publish(
            self.store,
            self.spec,
            cfg.output_version,
            weights,
            {
                "run_id": cfg.run_id,
                "config_hash": self.plan.config_hash,
                "init": fitted.state.init,
                "steps": self.plan.total,
                "data_interval": [str(cfg.data_interval_start), str(cfg.interval_end)],
                "labels": self.examples.kind,
                # positive pairs train the embedding alone: the head's scores mean nothing
                **({"head_trained": False} if self.examples.kind == "positive" else {}),
            },
            tokenizer_json=self.tokenizer_json,
        )

    def report(self, fitted: Fitted, version_url: str | None) -> dict[str, Any]:
        """The train report (``reports/train.json``) of this attempt, cost included;
        ``wall_seconds`` counts from :meth:`open` to now. Written by the caller."""
        cfg, plan, backend, state = self.cfg, self.plan, self.backend, fitted.state
        evaluator, stats = fitted.evaluator, fitted.stats
        eval_seconds = 0.0 if evaluator is None else evaluator.seconds
        loop_seconds = stats.seconds - eval_seconds
        first_step_seconds = stats.first_step_seconds
        report = {
            "status": "ok",
            "model": cfg.model,
            "run_id": cfg.run_id,
            "version": cfg.output_version,
            "version_url": version_url,
            "init": state.init,
            "resumed_from": fitted.resumed_from,
            "steps": plan.total,
            "steps_this_attempt": fitted.steps_run,
            "epochs": cfg.epochs,
            "batch_size": plan.batch_size,
            "rows": len(self.examples),
            "labels": self.examples.kind,
            "objective": "contrastive" if self.examples.kind == "positive" else "pointwise",
            "features": [list(pair) for pair in self.spec.features],
            "missing_documents": self.examples.missing_documents,
            "data_interval": [str(cfg.data_interval_start), str(cfg.interval_end)],
            "sources": list(self.examples.sources),
            "samples_per_second": round(fitted.steps_run * plan.samples_per_step / loop_seconds, 2)
            if fitted.steps_run and loop_seconds > 0
            else None,
            "wall_seconds": round(time.perf_counter() - self.started, 3),
            "loss_curve": state.loss_curve,
            "final_loss": state.loss_curve[-1][1] if state.loss_curve else None,
            "eval_every": cfg.eval_every,
            "eval_curve": state.eval_curve,
            "eval_seconds": round(eval_seconds, 3),
            "eval_compiles": 0 if evaluator is None else evaluator.compiles,
            "dropout": self.spec.encoder.dropout if cfg.dropout is None else cfg.dropout,
            "checkpoint_every": cfg.checkpoint_every,
            "config_hash": plan.config_hash,
            "compiles_after_warmup": stats.compiles_after_warmup,
            "compiles": backend.compiles(),
            "compile": {**self.compile_info, "graph_cache": backend.graph_cache()},
            "seconds_to_first_step": None
            if first_step_seconds is None
            else round(first_step_seconds, 3),
            "padding": "max_length" if backend.static_shapes else "longest",
            "parallelism": {"parallelism": "ddp"}
            if self.sharding is None
            else self.sharding.describe(),
            "activation_checkpointing": cfg.activation_checkpointing,
            # What each rank held of weights, gradients and optimizer state at the end.
            "tensor_bytes_per_rank": fitted.tensor_bytes,
            "peak_rss_mib": round(rss_mib()[1], 1),
            **backend.metadata(),
        }
        report.update(
            run_cost(
                self.backend_name, report["wall_seconds"], cfg.instance_type, cfg.instance_prices
            )
        )
        return report


def padding_line(backend: Backend, data: TrainingSet, max_length: int) -> str:
    """What the log says of how this run's batches are padded."""
    q, p = (float(m.sum(1).float().mean()) for m in (data.query_mask, data.product_mask))
    lengths = f"queries {q:.1f} tokens on average, products {p:.1f}"
    if backend.static_shapes:
        why = "torch.compile" if backend.compiled else f"backend {backend.name}"
        return f"batches padded to max_length {max_length} (static shapes: {why}); {lengths}"
    return (
        f"batches padded to their longest query and product (multiple of 8), not to "
        f"max_length {max_length}; {lengths}"
    )


def _check_resumable(store: ArtifactStore, cfg: TrainConfig, plan: TrainPlan) -> None:
    """Refuse, before any write, a run id whose newest checkpoint this run cannot resume:
    one of another parallelism (whole weights against shards: they do not convert), or a
    sharded one of another global batch (the fix names the batch size that keeps it)."""
    meta = CheckpointManager(
        store, cfg.model, cfg.run_id, cfg.keep_last, plan.config_hash
    ).latest_meta()
    if meta is None:
        return
    saved = meta.get("parallelism", "ddp")
    sharded = meta.get("format") == SHARDED
    if sharded != (cfg.parallelism != "ddp"):
        kind = "sharded (fsdp/hsdp)" if sharded else "whole-model (ddp)"
        raise BadInputError(
            f"checkpoint {meta['url']} of run {cfg.run_id} is {kind}, written with "
            f"parallelism={saved}, and this run has parallelism={cfg.parallelism}: whole "
            f"and sharded checkpoints do not convert into each other. Resume with "
            f"parallelism={saved}, or start a new run id"
        )
    if not sharded or meta.get("config_hash") == plan.config_hash:
        return
    ranks, batch = meta.get("world_size"), meta.get("global_batch")
    if batch and batch != plan.samples_per_step and batch % plan.world_size == 0:
        raise BadInputError(
            f"checkpoint {meta['url']} was saved with a global batch of {batch} ({ranks} "
            f"ranks); this run's is {plan.world_size} x {plan.batch_size} = "
            f"{plan.samples_per_step}: set batch_size={batch // plan.world_size} to resume "
            f"it with {plan.world_size} ranks (DCP reshards it), or start a new run id"
        )


def _check_writable(store: ArtifactStore, cfg: TrainConfig) -> None:
    """Fail before training, not after it, when the run's folder cannot be written."""
    probe = f"{layout.run_dir(cfg.model, cfg.run_id)}/.write-probe"
    store.write_bytes(probe, b"")
    store.remove(probe)
