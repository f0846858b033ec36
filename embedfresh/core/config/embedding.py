"""Config of the embed job and its verifier (``python -m embedfresh.jobs.embed``, ``embedfresh.jobs.embed_verify``)."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from embedfresh.core.config.base import JobConfig
from embedfresh.core.layout import safe_id

DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 384, 512)
"""Padded lengths texts are bucketed into; those above the truncation length are dropped."""


class VectorConfig(JobConfig):
    """The settings of a corpus's vectors that a job chooses (the rest come from the
    model version): the embed job embeds with them, and the evaluation scores search
    with the same, so the gate judges what is served."""

    max_length: int | None = Field(default=None, ge=2)
    """Truncation length in tokens; None: the model's own ``max_seq_length`` (its
    sentence-transformers config; else its max position embeddings), so the vectors equal
    ``SentenceTransformer(model).encode``. A length over the model's max position
    embeddings is refused. Texts cut at it are counted per shard and logged."""
    quantize: Literal["none", "int8", "bf16"] = "none"
    """A fast mode: ``int8``, PyTorch's PT2E int8 quantisation of the encoder's linear
    layers (torchao's ``X86InductorQuantizer``), activation scales calibrated on the
    corpus's first shard, compiled by inductor (CPU backend on x86; each task compiles
    its buckets' graphs on their first batches); ``bf16``, the encoder in bfloat16 (CPU
    and CUDA backends with native bf16: AMX or AVX512-BF16, compute capability 8.0+;
    refused elsewhere, where it would be emulated at 0.15x fp32). The job then first
    runs the fast mode's quality gate (recall@10 on the eval split of ``dataset``, the
    fast mode against fp32: one-sided non-inferiority at 95%, tolerance 0.001) and writes
    nothing unless it passes (docs/GATE.md, "Fast modes: int8 and bf16 embeddings")."""


class EmbedConfig(VectorConfig):
    """Embedding of corpus shards with one committed model version."""

    corpus: str = "products"
    """Corpus name: reads ``corpora/{corpus}/part-NNNNN.parquet`` (id, text)."""
    version: str
    """Model version to embed with (required: embeddings name the version they come from)."""
    shards: list[int] | None = None
    """Shard indices this task embeds (dynamic task mapping); None: every corpus shard."""
    token_budget: int = Field(default=4096, ge=1)
    """Padded tokens per batch: a batch of padded length L has ``token_budget // L`` rows."""
    lengths: list[int] = Field(default_factory=lambda: list(DEFAULT_LENGTHS))
    """The small fixed set of padded lengths (static shapes). Lengths above the truncation
    length are dropped and the truncation length itself is always one of them."""
    static_batches: bool = True
    """Pad the last batch of each length bucket to the bucket's row count (one shape per
    bucket for XLA/Neuron/compile). False trims it, which only saves work in eager mode."""
    packed: bool = True
    """On a CPU/CUDA backend, run the linear layers on the real tokens only, padding
    just for attention (:mod:`embedfresh.ml.embedding.packed`): same vectors, faster by
    what padding cost (about 1.15x on the benchmark's texts), by fusing query/key/value
    and, on AVX-512 AMD CPUs, by running the GEMMs on oneDNN (about 2x MKL there; Intel
    and AVX2 CPUs keep MKL, as fast or faster). Ignored on xla/neuron, which keep the
    static padded shapes."""
    compile: bool = False
    """On a CPU/CUDA backend, run the padded encoder forward through ``torch.compile``
    (inductor), one graph per bucket length (needs ``static_batches``), stored in and
    restored from the compile cache (:mod:`embedfresh.ml.embedding.compiled`): the
    first task with a new model or setting compiles, later ones load. Same vectors
    (cosine >= 0.99999). Off by default: on the CPUs measured it ran no faster than the
    eager forward and its cold compile costs minutes (docs/BENCHMARKS.md, "The compiled
    embed forward")."""
    compile_cache_root: str | None = None
    """Artifact root whose ``compile-cache/`` holds the compiled embed graphs; None:
    ``artifact_root``."""
    prefetch: int = Field(default=1, ge=1, le=2)
    """Shards read and tokenised ahead of the one being embedded (bounded memory)."""
    dataset: str = "products"
    """Dataset whose eval split the fast mode's quality gate reads (unused with
    quantize=none)."""
    mode: Literal["embed", "plan"] = "embed"
    """``plan``: embed nothing; list the shards whose output is not committed and current
    (the same reuse rule as ``embed``), split them in ``max_children`` slices and write
    the plan to ``plan`` (:mod:`embedfresh.core.embed_plan`): an array job's first step."""
    plan: str | None = None
    """Path of an embed plan under the artifact root. With ``mode=embed``: this execution
    is one child of an array job and embeds slice ``array_index`` of the plan; with
    ``mode=plan``: where the plan is written."""
    plan_sha256: str | None = None
    """sha256 of the plan's bytes: a child refuses a plan that is not the one it was
    submitted with."""
    array_index: int | None = Field(default=None, ge=0)
    """The child's index in its array job; default ``$AWS_BATCH_JOB_ARRAY_INDEX`` (what
    AWS Batch sets), else 0 (the plain job of a one-slice plan). Only with a plan."""
    max_children: int = Field(default=1000, ge=1, le=10_000)
    """``mode=plan``: the most slices (array children) the pending shards are cut in;
    AWS Batch takes at most 10,000 children per array job."""

    @model_validator(mode="before")
    @classmethod
    def _array_index_from_batch(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and data.get("plan")
            and data.get("mode", "embed") == "embed"
            and data.get("array_index") is None
        ):
            raw = os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "").strip()
            try:
                index = int(raw) if raw else 0
            except ValueError:
                raise ValueError(
                    f"AWS_BATCH_JOB_ARRAY_INDEX must be a whole number, got {raw!r}"
                ) from None
            data = {**data, "array_index": index}
        return data

    @model_validator(mode="after")
    def _compile_fields(self) -> EmbedConfig:
        if self.compile and not self.static_batches:
            raise ValueError(
                "compile=true needs static_batches=true: one graph per bucket length "
                "(a trimmed last batch would compile one more graph per bucket)"
            )
        if self.quantize == "int8" and not self.static_batches:
            raise ValueError(
                "quantize=int8 runs a compiled int8 graph per bucket and needs "
                "static_batches=true (a trimmed last batch would compile one more graph "
                "per bucket)"
            )
        if self.compile and self.quantize == "int8":
            raise ValueError(
                "quantize=int8 is compiled by its own route (PT2E, then inductor with "
                "freezing); compile=true is for fp32 and bf16 encoders: drop compile=true"
            )
        return self

    @model_validator(mode="after")
    def _plan_fields(self) -> EmbedConfig:
        if self.mode == "plan":
            if not self.plan:
                raise ValueError("mode=plan needs plan: the path to write the plan to")
            if self.array_index is not None:
                raise ValueError("array_index is for the children of a plan, not mode=plan")
        if self.plan and self.shards is not None:
            raise ValueError("give shards or plan, not both: a plan names the shards")
        if self.array_index is not None and not self.plan:
            raise ValueError("array_index needs plan: the index is a slice of a plan")
        return self

    @field_validator("plan")
    @classmethod
    def _plan_path(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parts = v.split("/")
        if v.startswith("/") or "://" in v or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"plan must be a relative path under the artifact root, got {v!r}")
        for part in parts:
            safe_id(part, "plan path segment")
        return v

    @field_validator("corpus", "version", "dataset")
    @classmethod
    def _segment(cls, v: str) -> str:
        return safe_id(v, "name")

    def lease_unit(self, job: str) -> str:
        """Mapped embed tasks of one run hold different units: their shards; the children
        of one array job theirs (the plan and the index); a planner its plan."""
        if self.plan:
            tag = hashlib.sha256(self.plan.encode()).hexdigest()[:12]
            if self.mode == "plan":
                return f"{job}-plan-{tag}"
            return f"{job}-plan-{tag}-{self.array_index}"
        if self.shards is None:
            return f"{job}-{self.corpus}"
        listed = "-".join(str(i) for i in sorted(self.shards))
        if len(listed) > 64:
            listed = hashlib.sha256(listed.encode()).hexdigest()[:16]
        return f"{job}-{self.corpus}-shards-{listed}"

    @field_validator("shards")
    @classmethod
    def _shards(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("shards must name at least one shard (or be null for all)")
        if any(i < 0 for i in v):
            raise ValueError("shard indices must be >= 0")
        if len(set(v)) != len(v):
            raise ValueError("shard indices must be unique")
        return sorted(v)

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        if not v or any(n < 2 for n in v):
            raise ValueError("lengths must be a non-empty list of padded lengths >= 2")
        return sorted(set(v))

    @property
    def report_kind(self) -> str:
        """``embed-<corpus>`` for all shards; ``embed-<corpus>-<first>-<last>`` (or
        ``embed-<corpus>-<i>``) otherwise; ``embed-<corpus>-plan`` for a planner,
        ``embed-<corpus>-child-<index>`` for a child of an array job: two corpora
        embedded in one run never share a report."""
        base = f"embed-{self.corpus}"
        if self.mode == "plan":
            return f"{base}-plan"
        if self.plan:
            return f"{base}-child-{self.array_index}"
        if self.shards is None:
            return base
        first, last = self.shards[0], self.shards[-1]
        return f"{base}-{first}" if first == last else f"{base}-{first}-{last}"


class ExportConfig(JobConfig):
    """Export of a model version's encoder in the sentence-transformers format."""

    version: str
    """Model version to export (written under its own ``sentence-transformers/``)."""
    max_seq_length: int | None = Field(default=None, ge=2)
    """Truncation length written to ``sentence_bert_config.json``; None: the model's own
    (what the embed job uses by default), so the exported model reproduces the job's
    vectors. A length over the model's max position embeddings is refused."""

    @field_validator("version")
    @classmethod
    def _segment(cls, v: str) -> str:
        return safe_id(v, "name")
