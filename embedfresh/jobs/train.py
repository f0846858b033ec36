"""Incremental training: ``python -m embedfresh.jobs.train --config train.yaml``.

Starts from the production model (or the config's base weights), trains on the data
interval's partitions, checkpoints every N steps and resumes bit-exactly from the
newest committed checkpoint of its run id, then publishes a model version and
``runs/{model}/{run_id}/reports/train.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embedfresh.core import layout
from embedfresh.core.cli import main_for
from embedfresh.core.config import TrainConfig
from embedfresh.core.cost import run_cost
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.backends import Backend, get_backend
from embedfresh.ml.checkpoint import Checkpoint, CheckpointManager, cpu_state_dict
from embedfresh.ml.compile import (
    cache_key,
    modes,
    neuron_env,
    resolve_backend,
    resolve_mode,
    torch_cache,
)
from embedfresh.ml.compile.neuron import cache_root
from embedfresh.ml.data.reader import Examples, read_train
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import ModelSpec, get_spec, tokenizer_file
from embedfresh.ml.model.relevance import RelevanceModel, in_batch_contrastive
from embedfresh.ml.model.tokenizer import TextTokenizer

log = logging.getLogger("embedfresh.jobs.train")

#: Steps of an attempt that may trace new graphs: the first one traces forward+backward
#: and the optimizer's state initialisation (a one-off graph on XLA), the second the
#: steady-state update. Any compilation after them is a recompile (``compiles_after_warmup``).
WARMUP_STEPS = 2


@dataclass(frozen=True)
class TrainingSet:
    """Pre-tokenised, fixed-shape tensors of one data interval."""

    query_ids: torch.Tensor
    query_mask: torch.Tensor
    product_ids: torch.Tensor
    product_mask: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def build(cls, examples: Examples, tokenizer: TextTokenizer) -> TrainingSet:
        q, p = tokenizer(examples.queries), tokenizer(examples.products)
        return cls(
            torch.from_numpy(q.input_ids),
            torch.from_numpy(q.attention_mask),
            torch.from_numpy(p.input_ids),
            torch.from_numpy(p.attention_mask),
            torch.from_numpy(examples.features),
            torch.from_numpy(examples.labels),
        )

    def batch(self, index: np.ndarray) -> dict[str, torch.Tensor]:
        i = torch.from_numpy(index)
        return {
            "query_ids": self.query_ids[i],
            "query_mask": self.query_mask[i],
            "product_ids": self.product_ids[i],
            "product_mask": self.product_mask[i],
            "features": self.features[i],
            "labels": self.labels[i],
        }


class RankBatches:
    """This rank's host batches of steps ``first..total``, in order: step ``s`` takes
    the rank's shard of the global batch at its position in the epoch order. Iterable
    more than once and sized, as a data loader (and ``MpDeviceLoader``) expects."""

    def __init__(
        self,
        data: TrainingSet,
        seed: int,
        per_epoch: int,
        batch_size: int,
        rank: int,
        world_size: int,
        first: int,
        total: int,
    ) -> None:
        self.data, self.seed, self.per_epoch, self.batch_size = data, seed, per_epoch, batch_size
        self.rank, self.world_size, self.first, self.total = rank, world_size, first, total

    def __len__(self) -> int:
        return self.total - self.first

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order, order_epoch = None, -1
        for step in range(self.first, self.total):
            epoch, position = divmod(step, self.per_epoch)
            if epoch != order_epoch:
                order, order_epoch = epoch_order(self.seed, epoch, len(self.data.labels)), epoch
            start = (position * self.world_size + self.rank) * self.batch_size
            yield self.data.batch(order[start : start + self.batch_size])


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of an epoch: a pure function of (seed, epoch), so resuming at
    any step replays exactly the batches an uninterrupted run would see."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def data_fingerprint(examples: Examples) -> str:
    h = hashlib.sha256()
    for arr in (examples.query_ids, examples.product_ids, examples.features, examples.labels):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


def config_hash(
    cfg: TrainConfig, spec: ModelSpec, data_fp: str, steps: int, world_size: int = 1
) -> str:
    """What must match for a checkpoint to be resumed: everything that changes the math."""
    relevant = cfg.model_dump(
        mode="json",
        exclude={
            "artifact_root",
            "run_id",
            "backend",
            "log_every",
            "keep_last",
            "version",
            "eval_every",  # evaluation draws no random numbers: it never changes the math
            "eval_batch_size",
            # where it runs and what it costs, not what it computes (torch.compile's
            # fusions may round differently, but a retry runs the same config)
            "compile",
            "compile_cache_root",
            "neuron_cc_flags",
            "instance_type",
            "instance_prices",
        },
    )
    for optional in ("init_version", "dropout"):  # unset: the hash of configs before them
        if relevant[optional] is None:
            del relevant[optional]
    hashed = {"cfg": relevant, "spec": spec.fingerprint(), "data": data_fp, "steps": steps}
    if world_size > 1:  # data parallel: another batch composition (absent: hashes before it)
        hashed["world_size"] = world_size
    blob = json.dumps(hashed, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_optimizer(
    model: RelevanceModel, cfg: TrainConfig, incremental: bool
) -> torch.optim.Optimizer:
    """AdamW with the config's learning rates, scaled down when continuing from a trained
    model: at the full rate a refresh forgets more than it learns (measured on the demo,
    day 2 from day 1: recall@10 0.048 at 1e-3 vs 0.061 at 1e-4, day 1 had 0.057)."""
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


def rng_state(backend: Backend | None = None) -> dict[str, Any]:
    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    device = None if backend is None else backend.device_rng_state()
    if device is not None:  # an XLA device draws dropout masks from its own generator
        state["device"] = {"backend": backend.name, "state": device}
    return state


def set_rng_state(state: dict[str, Any], backend: Backend | None = None, seed: int = 0) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.asarray(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(state["torch"])
    if backend is None:
        return
    device = state.get("device")
    if device is not None and device.get("backend") == backend.name:
        backend.set_device_rng_state(device["state"])
    else:  # written on another backend: a deterministic stream for this one
        backend.seed(seed)


def set_dropout(model: torch.nn.Module, p: float) -> None:
    """Set every dropout probability of ``model`` to ``p`` (``TrainConfig.dropout``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
        if hasattr(module, "dropout_p"):  # attention dropout inside SDPA
            module.dropout_p = p


class EvalPoints:
    """Evaluation of the current weights during training (``TrainConfig.eval_every``).

    Each point writes ``reports/eval-step-{step:08d}.json`` with its outcomes, in the
    evaluate job's format, and appends ``{step, metrics}`` to the curve. It must not
    change training: the RNG state (torch's and the device's; an XLA device advances its
    seed at every sync) is saved before and restored after, and the model is put back in
    train mode. Graph compilations it causes are counted apart (``compiles``).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        store: ArtifactStore,
        backend: Backend,
        tokenizer: TextTokenizer,
        curve: list[dict[str, Any]],
    ) -> None:
        from embedfresh.ml.evaluation import EvalSet  # noqa: PLC0415 - only when evaluating

        self.cfg, self.store, self.backend = cfg, store, backend
        self.data = EvalSet.load(store, cfg.dataset, tokenizer)
        self.curve = curve
        self.compiles = 0
        self.seconds = 0.0

    def due(self, done: int, total: int) -> bool:
        return done % self.cfg.eval_every == 0 or done == total

    def __call__(self, model: RelevanceModel, done: int, version: str) -> None:
        from embedfresh.ml.evaluation import evaluate_model, write_outcomes  # noqa: PLC0415

        started = time.perf_counter()
        compiles_before = self.backend.compiles()
        saved = rng_state(self.backend)
        try:
            metrics, tables = evaluate_model(
                model, self.backend, self.data, self.cfg.eval_batch_size
            )
        finally:
            set_rng_state(saved, self.backend)
            model.train()
        self.compiles += self.backend.compiles() - compiles_before
        cfg, name = self.cfg, layout.eval_step_report(done)
        outcomes = write_outcomes(self.store, cfg.model, cfg.run_id, name, tables)
        seconds = time.perf_counter() - started
        self.seconds += seconds
        self.store.write_json(
            layout.report(cfg.model, cfg.run_id, name),
            {
                "status": "ok",
                "model": cfg.model,
                "run_id": cfg.run_id,
                "version": version,
                "step": done,
                "dataset": cfg.dataset,
                "metrics": metrics,
                "n_examples": len(self.data.examples),
                "n_queries": len(self.data.query_ids),
                "n_products": len(self.data.product_ids),
                "recall_pool": self.data.recall_pool,
                "outcomes": outcomes,
                "wall_seconds": round(seconds, 3),
                **self.backend.metadata(),
            },
        )
        self.curve[:] = [p for p in self.curve if p["step"] != done]
        self.curve.append({"step": done, "metrics": metrics})
        log.info("eval at step %d: %s", done, metrics)


class ScoreAndEmbed(torch.nn.Module):
    """``model.score_and_embed`` as a module's forward, so DistributedDataParallel (which
    hooks ``forward``) can wrap the training step."""

    def __init__(self, model: RelevanceModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.model.score_and_embed(*args)


def resolve_init(cfg: TrainConfig, store: ArtifactStore, model: RelevanceModel) -> dict[str, Any]:
    """Load the starting weights into ``model``; returns where they came from."""
    if cfg.init == "version":
        pinned = cfg.init_version
        if versions.is_committed(store, cfg.model, pinned) is None:
            raise BadInputError(
                f"init_version {pinned} of {cfg.model} is not a committed model version"
            )
        version = versions.load(store, cfg.model, pinned)
        if version.spec.fingerprint() != model.spec.fingerprint():
            raise BadInputError(
                f"version {version.url} has another architecture than model config {cfg.model!r}"
            )
        model.load_state_dict(version.weights, strict=True)
        return {"source": "version", "version": pinned, "url": version.url}
    production = None
    if cfg.init in ("auto", "production"):
        production = Registry(store, cfg.model).production_version()
        if production is None and cfg.init == "production":
            raise BadInputError(
                f"init=production but {store.url(layout.registry(cfg.model))} has no "
                "production version yet (use init=auto or init=base)"
            )
    if production is not None:
        version = versions.load(store, cfg.model, production)
        if version.spec.fingerprint() != model.spec.fingerprint():
            raise BadInputError(
                f"production version {version.url} has another architecture than "
                f"model config {cfg.model!r}"
            )
        model.load_state_dict(version.weights, strict=True)
        return {"source": "production", "version": production, "url": version.url}
    return {"source": "base", "weights": versions.load_base_weights(model)}


def prepare_compile(cfg: TrainConfig, backend_name: str) -> dict[str, Any]:
    """Before the backend starts: Neuron's compile environment (the one the compile job
    gave its trial), or the torch.compile cache entry restored. Returns the report's
    ``compile`` section."""
    mode = resolve_mode(cfg.compile, backend_name, cfg.model)
    info: dict[str, Any] = {"mode": mode}
    if mode == modes.NEURON_PARALLEL_COMPILE:
        env = neuron_env(cfg)
        os.environ.update(env)
        info["env"] = env
    elif mode == modes.TORCH_COMPILE:
        key = cache_key(cfg, backend_name, mode, int(os.environ.get("WORLD_SIZE", "1")))
        info["cache"] = torch_cache.restore(cache_root(cfg), backend_name, key)
    return info


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train incrementally on one data interval and publish a model version."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    spec = get_spec(cfg.model)
    backend_name = resolve_backend(cfg.backend)
    run_cost(backend_name, 0.0, cfg.instance_type, cfg.instance_prices)  # bad type: fail now
    compile_info = prepare_compile(cfg, backend_name)
    backend = get_backend(backend_name)
    examples = read_train(store, cfg.dataset, cfg.data_interval_start, cfg.interval_end)
    batch_size = cfg.batch_size or spec.default_batch_size
    world = backend.world_size  # each rank trains on its own batch_size rows per step
    per_epoch = len(examples) // (batch_size * world)  # drop_last: fixed shapes
    if per_epoch == 0:
        raise BadInputError(
            f"data interval {cfg.data_interval_start}..{cfg.interval_end} has "
            f"{len(examples)} rows, fewer than one batch of {batch_size} x {world} ranks"
        )
    total = (
        per_epoch * cfg.epochs
        if cfg.max_steps is None
        else min(cfg.max_steps, per_epoch * cfg.epochs)
    )
    chash = config_hash(cfg, spec, data_fingerprint(examples), total, world)
    report_rel = layout.report(cfg.model, cfg.run_id, "train")
    if backend.is_main:
        _check_writable(store, cfg)

    published = versions.is_committed(store, cfg.model, cfg.output_version)
    if published is not None:
        if published.get("config_hash") != chash:
            raise BadInputError(
                f"model version {cfg.output_version} of {cfg.model} already exists from "
                "another configuration; versions are immutable (set another version)"
            )
        log.info("version %s already published by this run: nothing to train", cfg.output_version)
        return _summary(store.read_json(report_rel), store.url(report_rel))

    tokenizer = TextTokenizer(tokenizer_file(), spec.max_length)
    data = TrainingSet.build(examples, tokenizer)
    model = versions.build_model(spec, cfg.seed)
    manager = CheckpointManager(store, cfg.model, cfg.run_id, cfg.keep_last, chash)
    checkpoint = manager.load_latest()
    if checkpoint is not None:
        model.load_state_dict(checkpoint.weights, strict=True)
        init = checkpoint.meta["init"]
        log.info("resuming from %s (step %d)", checkpoint.url, checkpoint.step)
    else:
        init = resolve_init(cfg, store, model)
        log.info("starting from %s", init)
    if cfg.dropout is not None:
        set_dropout(model, cfg.dropout)
    model.to(backend.device)
    # A trained start (production or a pinned version) is fine-tuned at the scaled rate.
    optimizer = make_optimizer(model, cfg, incremental=init["source"] in ("production", "version"))
    schedule = make_schedule(optimizer, cfg.warmup_steps, total)
    first_step = 0
    loss_curve: list[list[float]] = []
    eval_curve: list[dict[str, Any]] = []
    if checkpoint is not None:
        first_step = _restore(checkpoint, optimizer, schedule, backend, cfg.seed)
        loss_curve = checkpoint.meta.get("loss_curve", [])
        eval_curve = checkpoint.meta.get("eval_curve", [])
    else:
        # dropout stream independent of how init was reached; one per rank
        torch.manual_seed(cfg.seed + backend.rank)
        backend.seed(cfg.seed)
    evaluator = (
        None
        if cfg.eval_every is None or not backend.is_main
        else EvalPoints(cfg, store, backend, tokenizer, eval_curve)
    )
    forward = model.score_and_embed
    if backend.world_size > 1:
        forward = backend.data_parallel(ScoreAndEmbed(model))
    if compile_info["mode"] == modes.TORCH_COMPILE:
        forward = backend.compile(forward)

    loop_started = time.perf_counter()
    loss_curve, compiles_after_warmup, first_step_seconds = _loop(
        cfg,
        backend,
        model,
        forward,
        optimizer,
        schedule,
        data,
        manager,
        first_step,
        total,
        per_epoch,
        batch_size,
        init,
        loss_curve,
        evaluator,
    )
    loop_seconds = time.perf_counter() - loop_started
    eval_seconds = 0.0 if evaluator is None else evaluator.seconds
    if not backend.is_main:  # rank 0 alone publishes the version and the report
        backend.stop_distributed()
        return {"status": "ok", "rank": backend.rank, "steps": total}

    weights = cpu_state_dict(model)
    version_url = versions.publish(
        store,
        spec,
        cfg.output_version,
        weights,
        {
            "run_id": cfg.run_id,
            "config_hash": chash,
            "init": init,
            "steps": total,
            "data_interval": [str(cfg.data_interval_start), str(cfg.interval_end)],
        },
    )
    steps_run = total - first_step
    report = {
        "status": "ok",
        "model": cfg.model,
        "run_id": cfg.run_id,
        "version": cfg.output_version,
        "version_url": version_url,
        "init": init,
        "resumed_from": None
        if checkpoint is None
        else {"step": checkpoint.step, "url": checkpoint.url},
        "steps": total,
        "steps_this_attempt": steps_run,
        "epochs": cfg.epochs,
        "batch_size": batch_size,
        "rows": len(examples),
        "data_interval": [str(cfg.data_interval_start), str(cfg.interval_end)],
        "sources": list(examples.sources),
        "samples_per_second": round(
            steps_run * batch_size * world / (loop_seconds - eval_seconds), 2
        )
        if steps_run and loop_seconds > eval_seconds
        else None,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "loss_curve": loss_curve,
        "final_loss": loss_curve[-1][1] if loss_curve else None,
        "eval_every": cfg.eval_every,
        "eval_curve": eval_curve,
        "eval_seconds": round(eval_seconds, 3),
        "eval_compiles": 0 if evaluator is None else evaluator.compiles,
        "dropout": model.spec.encoder.dropout if cfg.dropout is None else cfg.dropout,
        "checkpoint_every": cfg.checkpoint_every,
        "config_hash": chash,
        "compiles_after_warmup": compiles_after_warmup,
        "compiles": backend.compiles(),
        "compile": compile_info,
        "seconds_to_first_step": None
        if first_step_seconds is None
        else round(first_step_seconds, 3),
        **backend.metadata(),
    }
    report.update(
        run_cost(backend_name, report["wall_seconds"], cfg.instance_type, cfg.instance_prices)
    )
    store.write_json(report_rel, report)
    backend.stop_distributed()
    return _summary(report, store.url(report_rel))


def _check_writable(store: ArtifactStore, cfg: TrainConfig) -> None:
    """Fail before training, not after it, when the run's folder cannot be written."""
    probe = f"{layout.run_dir(cfg.model, cfg.run_id)}/.write-probe"
    store.write_bytes(probe, b"")
    store.remove(probe)


def _restore(
    checkpoint: Checkpoint,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LambdaLR,
    backend: Backend,
    seed: int,
) -> int:
    optimizer.load_state_dict(checkpoint.state["optimizer"])
    schedule.load_state_dict(checkpoint.state["schedule"])
    ranks = checkpoint.state.get("rng_ranks")
    rng = ranks[backend.rank] if ranks and len(ranks) == backend.world_size else None
    set_rng_state(rng or checkpoint.state["rng"], backend, seed=seed * 1_000_003 + checkpoint.step)
    return checkpoint.step


def _loop(
    cfg: TrainConfig,
    backend: Backend,
    model: RelevanceModel,
    forward: Any,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LambdaLR,
    data: TrainingSet,
    manager: CheckpointManager,
    first_step: int,
    total: int,
    per_epoch: int,
    batch_size: int,
    init: dict[str, Any],
    loss_curve: list[list[float]],
    evaluator: EvalPoints | None = None,
) -> tuple[list[list[float]], int, float | None]:
    """Steps ``first_step..total`` with ``forward`` (``model.score_and_embed``, compiled
    or not); returns the loss curve, the graph compilations after this attempt's first
    :data:`WARMUP_STEPS` steps, evaluation's own apart (0 with fixed shapes), and the
    seconds from the loop's start to the end of its first step (compilation included)."""
    loop_started = time.perf_counter()
    first_step_seconds = None
    # neuron_parallel_compile's trial extracts graphs and runs none: its values are junk.
    extracting = bool(os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY"))
    model.train()
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batches = backend.loader(
        RankBatches(
            data,
            cfg.seed,
            per_epoch,
            batch_size,
            backend.rank,
            backend.world_size,
            first_step,
            total,
        )
    )
    compiles_after_first, eval_compiles_at_warmup = None, 0

    def record(loss: torch.Tensor, done: int, epoch: int) -> None:
        value = float(loss.detach().to("cpu"))
        if not np.isfinite(value) and not extracting:
            raise BadInputError(
                f"loss is {value} at step {done}: training diverged (lower the learning "
                "rate or check the data); no checkpoint or model was written for it"
            )
        loss_curve.append([done, round(value, 6)])
        log.info("step %d/%d epoch %d loss %.4f", done, total, epoch, value)

    for step, batch in zip(range(first_step, total), batches, strict=False):
        epoch, position = divmod(step, per_epoch)
        with backend.autocast():
            logits, q, p = forward(
                batch["query_ids"],
                batch["query_mask"],
                batch["product_ids"],
                batch["product_mask"],
                batch["features"],
            )
            loss = loss_fn(logits.float(), batch["labels"])
            if cfg.contrastive_weight:
                loss = loss + cfg.contrastive_weight * in_batch_contrastive(
                    q, p, batch["labels"], cfg.contrastive_temperature
                )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        done = step + 1
        if done % cfg.log_every == 0 or done == total or done % cfg.checkpoint_every == 0:
            # Eager: now. XLA: at the sync below, once the loss is materialised, so
            # reading it never cuts the step's graph (and a NaN stops before the update).
            backend.after_step(record, loss, done, epoch)
        backend.mark_step()
        backend.optimizer_step(optimizer)
        schedule.step()
        backend.mark_step()
        if first_step_seconds is None:
            first_step_seconds = time.perf_counter() - loop_started
        if done - first_step == WARMUP_STEPS:
            compiles_after_first = backend.compiles()
            eval_compiles_at_warmup = 0 if evaluator is None else evaluator.compiles
        if evaluator is not None and evaluator.due(done, total):
            evaluator(model, done, cfg.output_version)
        if done % cfg.checkpoint_every == 0 and done < total:
            rngs = backend.gather(rng_state(backend))  # every rank's, for a bit-exact resume
            if not backend.is_main:
                continue
            state = {
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "rng": rngs[0],
            }
            if backend.world_size > 1:
                state["rng_ranks"] = rngs
            url = manager.save(
                done,
                cpu_state_dict(model),
                state,
                {
                    "init": init,
                    "epoch": epoch,
                    "position_in_epoch": position + 1,
                    "samples_seen": done * batch_size * backend.world_size,
                    "loss_curve": loss_curve,
                    "eval_curve": [] if evaluator is None else evaluator.curve,
                },
            )
            log.info("checkpoint step %d committed at %s", done, url)
    after = 0 if compiles_after_first is None else backend.compiles() - compiles_after_first
    if evaluator is not None and compiles_after_first is not None:
        after -= evaluator.compiles - eval_compiles_at_warmup  # evaluation's own graphs
    return loss_curve, after, first_step_seconds


def _summary(report: dict[str, Any], url: str) -> dict[str, Any]:
    keys = (
        "status",
        "version",
        "version_url",
        "steps",
        "final_loss",
        "samples_per_second",
        "wall_seconds",
        "resumed_from",
        "init",
        "compiles_after_warmup",
        "seconds_to_first_step",
        "compute_hours",
        "estimated_cost_usd",
    )
    return {**{k: report.get(k) for k in keys}, "report": url}


if __name__ == "__main__":
    main_for("train", TrainConfig, train)
