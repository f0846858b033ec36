"""Configs of the training jobs: train, compile (a trial of a training run) and parity."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from embedfresh.core.config.base import JobConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.layout import safe_id

#: Neuron's training defaults (DESIGN "Backends"); O1 compiles ~86% faster for ~5-7%
#: less throughput.
DEFAULT_NEURON_CC_FLAGS = (
    "--target trn1 --auto-cast all --auto-cast-type bf16 --model-type transformer --optlevel 1"
)


class TrainConfig(JobConfig):
    """Incremental training on the partitions of one data interval."""

    dataset: str = "products"
    """Data set name: trains on ``datasets/{dataset}/train/dt=YYYY-MM-DD/``."""
    features: list[tuple[str, Literal["identity", "log1p", "div5"]]] | None = None
    """The numeric columns the relevance head takes beside the texts, as ``[column,
    transform]`` pairs in input order (docs/DATA.md "Training data"); None: what the data
    set declares in its ``dataset.json``, or none (text-only). ``[]``: text-only. Any
    other column of the data is refused."""
    max_missing_documents: int = Field(default=0, ge=0)
    """Training rows whose ``doc_id`` the corpus lacks (and that carry no ``doc_text``)
    left out, counted in the report; more are refused (exit 2)."""
    data_interval_start: dt.date | None = None
    """First day of data (inclusive); None: the newest training partition in the store,
    read when the job starts (:meth:`with_day`)."""
    data_interval_end: dt.date | None = None
    """Last day of data (exclusive); defaults to the day after the start."""
    epochs: int = Field(default=2, ge=1)
    """Passes over the interval's training rows."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many optimizer steps even if epochs remain."""
    batch_size: int | None = Field(default=None, ge=1)
    """Examples per step; None takes the model config's default. Fixed (drop_last)."""
    learning_rate: float | None = Field(default=None, gt=0)
    """Peak learning rate of encoder and head; None: the model config's own two rates."""
    incremental_lr_scale: float = Field(default=0.1, gt=0, le=1)
    """Learning-rate factor when starting from the production model (fine-tuning)."""
    warmup_steps: int = Field(default=10, ge=0)
    """Steps of linear warm-up, then linear decay to 10% of the peak."""
    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global norm."""
    contrastive_weight: float = Field(default=1.0, ge=0)
    """Weight of the in-batch contrastive loss that trains the embedding for retrieval."""
    contrastive_temperature: float = Field(default=0.05, gt=0)
    """Temperature of that contrastive loss's softmax."""
    checkpoint_every: int = Field(default=50, ge=1)
    """Optimizer steps between checkpoints: the most work a failure can lose."""
    keep_last: int = Field(default=2, ge=1)
    """Committed checkpoints kept per run."""
    seed: int = 0
    """Seed of the weight init, data order and dropout: same seed, same run."""
    init: Literal["auto", "production", "base", "version"] = "auto"
    """``production``: start from the registry's production version (error if none);
    ``base``: from the config's base weights (random for tiny, MiniLM for minilm);
    ``auto``: production when there is one, else base; ``version``: from the pinned
    version ``init_version`` (setting ``init_version`` implies it)."""
    init_version: str | None = None
    """Pinned model version to start from (``init=version``): two runs, e.g. on two
    backends for the parity gate, start from the same weights whatever production is.
    Like ``production`` it counts as fine-tuning (``incremental_lr_scale`` applies)."""
    version: str | None = None
    """Name of the model version this run publishes; defaults to the run id."""
    log_every: int = Field(default=10, ge=1)
    """Optimizer steps between progress lines in the log."""
    eval_every: int | None = Field(default=None, ge=1)
    """Evaluate the current weights on the held-out split every this many steps (and at
    the last step): ``reports/eval-step-{step:08d}.json`` + outcomes, and the train
    report's ``eval_curve``. None: no evaluation during training."""
    eval_batch_size: int = Field(default=64, ge=1)
    """Batch size of those evaluations (fixed shape, like the evaluate job's)."""
    eval_queries: int | None = Field(default=4000, ge=1)
    """Judged queries those evaluations search (the first of the pool, as the evaluate
    job's ``queries``); None: all of them."""
    dropout: float | None = Field(default=None, ge=0, lt=1)
    """Override of the model config's dropout probability for this run's training (the
    architecture, and so the published version's spec, is unchanged). ``0`` makes a
    training step deterministic: no random draws, e.g. to compare backends' numerics."""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile on cpu/cuda: ``on``, ``off`` (eager), or ``auto``: whichever the
    benchmark measured faster for this backend and model config
    (:data:`embedfresh.ml.compile.modes.COMPILE_DEFAULTS`). With it on, the train job restores
    the compile job's cache entry first. xla/neuron always trace and compile graphs."""
    parallelism: Literal["ddp", "fsdp", "hsdp"] = "ddp"
    """How the ranks of a launch split the model. ``ddp``: each rank holds the whole
    model, its gradients and AdamW state (16 bytes a parameter in fp32) and gradients are
    all-reduced. ``fsdp``: parameters, gradients and optimizer state sharded over every
    rank (FSDP2, a unit per transformer block and the root), about 1/N of that a rank.
    ``hsdp``: sharded within groups of ``shard_size`` ranks (a node), replicated across
    groups. fsdp and hsdp need several ranks and checkpoint with
    torch.distributed.checkpoint, so a run resumes under another world size (keep the
    global batch, ``batch_size`` x ranks)."""
    shard_size: int | None = Field(default=None, ge=1)
    """hsdp: ranks of one shard group; None: the processes of one node
    (torchrun's ``LOCAL_WORLD_SIZE``). The world size must be a multiple of it."""
    mixed_precision: Literal["auto", "fp32", "bf16"] = "auto"
    """fsdp/hsdp: the dtype parameters are gathered in for forward and backward; gradients
    are reduced and the sharded master weights kept in fp32. ``auto``: bf16 on cuda,
    fp32 elsewhere. (ddp runs under the backend's autocast instead.)"""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations during backward instead of keeping
    them: less memory per batch for about a third more compute; the math is unchanged."""
    neuron_cc_flags: str = DEFAULT_NEURON_CC_FLAGS
    """``NEURON_CC_FLAGS`` of the neuron backend; the compile job's trial run and the
    real run get the same value (and the same ``NEURON_COMPILE_CACHE_URL``)."""
    compile_cache_root: str | None = None
    """Artifact root whose ``compile-cache/`` this run reads (torch.compile entries) and
    points Neuron at; None: ``artifact_root``. The compile job's trial, which trains in
    a throwaway store, sets it to the real root."""
    instance_type: str | None = None
    """Instance the run is billed as, for ``estimated_cost_usd``; None: the backend's
    usual one (:data:`embedfresh.core.cost.DEFAULT_INSTANCE`)."""
    instance_prices: dict[str, float] = Field(default_factory=dict)
    """USD per instance-hour overriding or extending :data:`embedfresh.core.cost.PRICES_USD`."""

    @field_validator("dataset", "version", "init_version")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "name")

    @field_validator("instance_prices")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: p for k, p in v.items() if not p >= 0}
        if bad:
            raise ValueError(f"instance prices must be >= 0 USD/hour, got {bad}")
        return v

    @model_validator(mode="after")
    def _init_version(self) -> TrainConfig:
        if self.init_version is not None and self.init not in ("auto", "version"):
            raise ValueError(f"init_version is set, so init must be 'version', not {self.init!r}")
        if self.init == "version" and self.init_version is None:
            raise ValueError("init=version needs init_version (the version to start from)")
        if self.init_version is not None and self.init == "auto":
            object.__setattr__(self, "init", "version")
        return self

    @model_validator(mode="after")
    def _parallelism(self) -> TrainConfig:
        sharded = self.parallelism != "ddp"
        if self.shard_size is not None and self.parallelism != "hsdp":
            raise ValueError(f"shard_size applies to parallelism=hsdp, not {self.parallelism}")
        if self.mixed_precision != "auto" and not sharded:
            raise ValueError(
                "mixed_precision applies to parallelism=fsdp or hsdp (ddp computes under "
                "the backend's autocast): leave it auto"
            )
        if sharded and self.compile == "on":
            raise ValueError(
                f"compile=on with parallelism={self.parallelism}: the sharded step is not "
                "compiled here; set compile=off (or auto) or parallelism=ddp"
            )
        return self

    @model_validator(mode="after")
    def _interval(self) -> TrainConfig:
        if self.data_interval_start is None and self.data_interval_end is not None:
            raise ValueError("data_interval_end needs data_interval_start (the first day)")
        if self.data_interval_start is not None and self.interval_end <= self.data_interval_start:
            raise ValueError(
                f"empty data interval: end {self.interval_end} is not after start "
                f"{self.data_interval_start}"
            )
        return self

    @property
    def interval_end(self) -> dt.date:
        if self.data_interval_start is None:
            raise ValueError("the data interval is not settled yet: call with_day() first")
        return self.data_interval_end or self.data_interval_start + dt.timedelta(days=1)

    def with_day(self, partitions: Sequence[dt.date], where: str) -> TrainConfig:
        """This config with its data interval settled against the training partitions
        the store holds (``partitions``, the days of ``where``'s ``dt=`` folders).

        No ``data_interval_start``: the newest partition, one day. A given interval: every
        day of it must be there. Jobs call it when they start, before their first write,
        so a manual run's empty day means the newest data at the time the run starts.

        :raises BadInputError: no partition at all, or a day of the interval missing; one
            line naming what the store holds.
        """
        held = sorted(set(partitions))
        if self.data_interval_start is None:
            if not held:
                raise BadInputError(
                    f"no training partition under {where}: generate the data "
                    "(python -m embedfresh.jobs.generate_data) or check the dataset name"
                )
            return self.model_copy(update={"data_interval_start": held[-1]})
        day, end = self.data_interval_start, self.interval_end
        while day < end:
            if day not in held:
                raise BadInputError(
                    f"missing training partition dt={day} under {where}: "
                    f"{describe_partitions(held)}; name one of those days, or leave the "
                    "day empty for the newest"
                )
            day += dt.timedelta(days=1)
        return self

    @property
    def output_version(self) -> str:
        return self.version or self.run_id


def describe_partitions(days: Sequence[dt.date], shown: int = 3) -> str:
    """What a store holds, in a few words: ``it holds dt=2026-01-01, dt=2026-01-02``, the
    first and last few of many, or ``it holds none``."""
    if not days:
        return "it holds none"
    names = [f"dt={d}" for d in days]
    if len(names) <= 2 * shown:
        return "it holds " + ", ".join(names)
    return (
        f"it holds {len(names)}: "
        + ", ".join(names[:shown])
        + ", ..., "
        + ", ".join(names[-shown:])
    )


#: Training fields a parity side may not set apart from the other: what makes the two
#: runs comparable (the start, the data, the evaluation points) or names them.
PARITY_SHARED = frozenset(
    {"artifact_root", "model", "run_id", "version", "init", "init_version", "dataset",
     "data_interval_start", "data_interval_end", "eval_every", "eval_batch_size", "eval_queries",
     "backend"}
)  # fmt: skip


class ParityConfig(TrainConfig):
    """Backend parity (DESIGN "The quality gate", parity mode): train the same start
    version with the same hyperparameters on backend A and backend B, evaluating at
    every ``eval_every`` steps, and gate B's curve against A's (two-sided |d| < tolerance
    at every common evaluation point). The training fields are those of
    :class:`TrainConfig`; ``backend`` is unused (see ``backend_a``/``backend_b``).

    Config against config: ``config_a`` and ``config_b`` set training fields of one side
    only (on one backend, or two), e.g. ``parallelism`` ddp against hsdp: the gate then
    proves that the other way of training gives the same model, within the tolerance,
    at every evaluation point."""

    backend_a: str = "cpu"
    """Reference backend; its run id is ``{run_id}-{backend_a}``."""
    backend_b: str = "xla"
    """Candidate backend; its run id is ``{run_id}-{backend_b}``."""
    eval_every: int | None = Field(default=50, ge=1)
    metrics: list[str] = Field(
        default_factory=lambda: ["accuracy", "auc", "log_loss", "ndcg_at_10"]
    )
    """Metrics gated at every evaluation point (two-sided: the relevance head's as much as
    search, since a migration must not move either)."""
    tolerance: float = Field(default=0.001, ge=0, lt=1)
    """Relative two-sided tolerance: 0.001 is the 0.1% SLA."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """Confidence level of the paired bootstrap intervals."""
    resamples: int = Field(default=1000, ge=100)
    """Bootstrap resamples per metric and evaluation point."""
    gate_seed: int = 0
    """Seed of the paired bootstrap (``seed`` is the training seed)."""
    timeout_seconds: float = Field(default=3600, gt=0)
    """Limit of each training subprocess."""
    config_a: dict[str, Any] = Field(default_factory=dict)
    """Training fields side a trains with over the shared ones (config against config),
    e.g. ``{"parallelism": "ddp"}``; not the start, data or evaluation points."""
    config_b: dict[str, Any] = Field(default_factory=dict)
    """Training fields side b trains with over the shared ones, e.g.
    ``{"parallelism": "hsdp"}``."""
    step: Literal["all", "a", "b", "compare"] = "all"
    """``all``: train both sides, then compare (one process, both backends on its
    machine); ``a`` or ``b``: train that side only (a task, or an AWS Batch job, on that
    backend's own machine); ``compare``: gate the two sides' curves, once both trained."""

    @model_validator(mode="after")
    def _parity(self) -> ParityConfig:
        if self.init_version is None:
            raise ValueError("parity needs init_version: both backends start from it")
        if self.eval_every is None:
            raise ValueError("parity needs eval_every: the curve is its evaluation points")
        for side in ("a", "b"):
            fields = getattr(self, f"config_{side}")
            unknown = sorted(set(fields) - set(TrainConfig.model_fields))
            if unknown:
                raise ValueError(f"config_{side}: {unknown} are not training fields")
            shared = sorted(set(fields) & PARITY_SHARED)
            if shared:
                raise ValueError(
                    f"config_{side}: {shared} must be the same on both sides (set them at "
                    "the top level)"
                )
            self.train_config(side)  # a side that does not validate fails here, not later
        return self

    def side_run_id(self, side: Literal["a", "b"]) -> str:
        """``{run_id}-{backend}``; ``-a``/``-b`` appended when both sides share a backend
        (the same backend twice is the control: it must give d == 0)."""
        backend = self.backend_a if side == "a" else self.backend_b
        run_id = f"{self.run_id}-{backend}"
        return run_id if self.backend_a != self.backend_b else f"{run_id}-{side}"

    def train_config(self, side: Literal["a", "b"]) -> TrainConfig:
        """The training config of one side: identical but for backend, run id, version."""
        extra = set(ParityConfig.model_fields) - set(TrainConfig.model_fields)
        data = self.model_dump(exclude=extra)
        run_id = self.side_run_id(side)
        data.update(
            getattr(self, f"config_{side}"),
            backend=self.backend_a if side == "a" else self.backend_b,
            run_id=run_id,
            version=None if self.version is None else self.version + run_id[len(self.run_id) :],
        )
        return TrainConfig.model_validate(data)


class CompileConfig(TrainConfig):
    """The compile job: a trial of the training run this config describes, shortened to
    ``trial_steps`` steps, one evaluation and one checkpoint save, in a throwaway store,
    so every graph is traced; its cache entry is stored under the compile-cache key."""

    data_interval_start: dt.date | None = None
    """Day of data the trial trains on; None: the newest training partition (only the
    first day of an interval is used: the trial needs one day)."""
    trial_steps: int = Field(default=5, ge=2)
    """Training steps of the trial (a checkpoint is saved at ``trial_steps - 1``)."""
    neuron_parallel_compile: str = "neuron_parallel_compile"
    """The executable (found on PATH) that wraps the neuron trial."""
    neuron_max_retries: int | None = Field(default=None, ge=0)
    """``NEURON_PARALLEL_COMPILE_MAX_RETRIES``; None leaves the tool's default."""
    timeout_seconds: float = Field(default=7200, gt=0)
    """Limit of the trial subprocess (xla, neuron)."""
