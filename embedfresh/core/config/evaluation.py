"""Configs of the evaluation side: evaluate, the quality gate, publishing a model."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field, field_validator, model_validator

from embedfresh.core.config.base import JobConfig
from embedfresh.core.config.embedding import VectorConfig
from embedfresh.core.layout import safe_id

#: The fewest judged queries a PASS rests on, in the gate and the search check.
MIN_QUERIES = 300


class EvaluateConfig(VectorConfig):
    """Evaluation of one model version on the data set's held-out split: the relevance
    head on its pairs, search on its judged queries against the corpus (docs/GATE.md).
    ``max_length`` and ``quantize`` must be the embed job's: the evaluation embeds
    queries and documents exactly as the release will serve them."""

    dataset: str = "products"
    """Data set whose held-out split (``datasets/{dataset}/eval/``) and judgments
    (``datasets/{dataset}/judgments/``, docs/DATA.md) are evaluated."""
    corpus: str | None = None
    """Corpus the judged queries search; None: the one the judgments name
    (``judgments.json``), else ``products``."""
    version: str | None = None
    """Model version to evaluate; defaults to the run id (what the train job published)."""
    queries: int | None = Field(default=4000, ge=1)
    """Judged queries of the first look: the first this many of the pool (the gate
    evaluates more while its decision is open, docs/GATE.md). None: the whole pool."""
    max_queries: int | None = Field(default=None, ge=1)
    """The most judged queries any look may use (the gate's and the search check's
    ``max_queries``): caps the first look too. None: the whole pool."""

    @property
    def first_look(self) -> int | None:
        """Queries of the first look: ``queries`` capped by ``max_queries``."""
        caps = [n for n in (self.queries, self.max_queries) if n is not None]
        return min(caps) if caps else None

    batch_size: int = Field(default=64, ge=1)
    """Examples per forward pass of the relevance head (fixed shape; the last batch is
    padded)."""
    report_name: str = "eval"
    """Report file name under the run's reports/ (``eval`` -> ``eval.json``)."""

    @field_validator("dataset", "version", "report_name", "corpus")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "name")

    @property
    def target_version(self) -> str:
        return self.version or self.run_id


class GateConfig(JobConfig):
    """The quality gate: candidate vs reference on the same held-out examples."""

    dataset: str = "products"
    """Data set of the eval split both versions are compared on."""
    version: str | None = None
    """Candidate version; defaults to the run id. Its eval report must exist."""
    mode: Literal["no_regression", "parity"] = "no_regression"
    """``no_regression``: one-sided, improvements pass; ``parity``: two-sided
    ``|d| < tolerance`` (docs/GATE.md)."""
    reference: str = "production"
    """``production`` (the registry's production version, falling back to the baseline
    before the first promotion) or a pinned version name."""
    baseline: str = "baseline"
    """Version used as reference before any promotion: published from the config's base
    weights (random init for tiny, all-MiniLM-L6-v2 for minilm) when missing."""
    metrics: list[str] = Field(default_factory=lambda: ["ndcg_at_10"])
    """Metrics that must all pass; each is compared on the same eval examples. The SLA
    is on search (nDCG@10 of the judged queries over the corpus); the relevance head's
    ``accuracy``, ``auc`` and ``log_loss``, and ``recall_at_10``, ``recall_at_100`` and
    ``mrr_at_10``, are reported and gated only when named (docs/GATE.md)."""
    max_queries: int | None = Field(default=None, ge=1)
    """The most judged queries the gate grows its evaluation to while undecided (looks
    at the candidate's first look, then twice as many each time); None: the whole pool."""
    tolerance: float = Field(default=0.001, ge=0, lt=1)
    """Relative tolerance: 0.001 is the 0.1% quality SLA."""
    min_queries: int = Field(default=MIN_QUERIES, ge=1)
    """The fewest examples (judged queries) a PASS rests on: on fewer, an interval that
    clears the margin is INCONCLUSIVE. A percentile bootstrap interval under-covers on few
    queries (measured, docs/GATE.md: a 95% interval's lower bound lies above the truth in 5%
    of trials at 10 to 30 queries, 4% at 100, 2.9% at 300, against 2.5%), and at one
    query it is no interval at all."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """Confidence level of the paired bootstrap intervals."""
    resamples: int = Field(default=1000, ge=100)
    """Bootstrap resamples per metric."""
    seed: int = 0
    """Seed of the bootstrap (and of the baseline's init, when it is published)."""
    batch_size: int = Field(default=64, ge=1)
    """Batch size of the reference's evaluation, when the gate has to run it."""
    report_name: str = "gate"
    """The decision's report, ``reports/{report_name}.json`` (with its ``.svg`` and
    ``.vl.json``): one per gate, so two gates of one run never overwrite each other's.
    Its reference's evaluation is ``eval-reference`` for ``gate``,
    ``{report_name}-reference`` otherwise."""
    eval_report: str = "eval"
    """The candidate's evaluation this gate reads, ``reports/{eval_report}.json``: the
    ``report_name`` of the evaluate job it follows."""
    refusal_exits: bool = True
    """Whether a decision other than PASS exits with code 3 (a person at a shell, a CI
    script). False: it exits 0 with the decision in its summary, for a scheduler that
    treats the decision as an outcome, not an error (the Airflow operator in
    ``no_regression`` mode). ``parity`` always exits 3 on non-PASS."""

    @field_validator("dataset", "version", "reference", "baseline", "report_name", "eval_report")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "name")

    @property
    def candidate_version(self) -> str:
        return self.version or self.run_id

    @property
    def reference_report(self) -> str:
        """The reference's evaluation report name (``reports/{name}.json``)."""
        return "eval-reference" if self.report_name == "gate" else f"{self.report_name}-reference"


class PublishModelConfig(JobConfig):
    """A team's own model (a sentence-transformers or transformers directory) published
    as a committed, checksummed version of ``model``, the start of its refreshes."""

    source: str
    """The model directory: a local path, ``file://...`` or ``s3://bucket/prefix``
    (sentence-transformers or Hugging Face transformers layout, safetensors weights,
    ``tokenizer.json``)."""
    version: str = "base"
    """Name of the version to publish (versions are immutable)."""
    production: bool = True
    """Make the version production when the model has no production version yet, so the
    first refresh trains from it and its gate compares against it. An existing
    production version is never moved by this job."""
    max_length: int | None = Field(default=None, ge=2)
    """Training length (fixed padded tokens of queries and products; a training setting,
    not the embedding length); None: the model's own ``max_seq_length``, at most 128."""
    head_hidden: int = Field(default=256, ge=1)
    """Width of the relevance head trained on top of the encoder."""
    batch_size: int = Field(default=32, ge=1)
    """Default training batch size of this model."""
    encoder_learning_rate: float = Field(default=5e-5, gt=0, allow_inf_nan=False)
    """Peak learning rate of the encoder when training starts from base weights."""
    head_learning_rate: float = Field(default=1e-3, gt=0, allow_inf_nan=False)
    """Peak learning rate of the relevance head."""
    seed: int = 0
    """Seed of the relevance head's initialisation."""

    @field_validator("version")
    @classmethod
    def _segment(cls, v: str) -> str:
        return safe_id(v, "name")


class ImportLabelsConfig(JobConfig):
    """A team's relevance labels, in the shape they have, written as a data set's
    judgments or as one day of its training pairs; a BEIR folder's collection as the
    corpus they judge (docs/DATA.md "Importing them")."""

    source: str
    """Where the labels are: a local path, ``file://...`` or ``s3://...``. ``esci`` and
    ``clicks``: one file (``.parquet``, ``.csv``, ``.tsv`` or ``.jsonl``); ``beir``: the
    data set's folder (``queries.jsonl``, ``qrels/<split>.tsv``, ``corpus.jsonl``)."""
    shape: Literal["esci", "beir", "clicks"]
    """``esci``: ESCI-style judgments (``query_id``, ``query``, ``product_id``,
    ``esci_label`` E/S/C/I); ``beir``: a BEIR / MS MARCO folder; ``clicks``: a click log
    (``query``, ``doc_id``, ``event``, optional ``query_id``)."""
    dataset: str
    """The data set written: its judgments (``datasets/{dataset}/judgments/``) or one
    day of its training pairs; what is already there is replaced."""
    into: Literal["judgments", "train"] = "judgments"
    """``judgments``: what the gate and the search check score on; ``train``: the
    training pairs of ``day`` (docs/DATA.md "Training data"), graded or positive."""
    day: dt.date | None = None
    """``into=train``: the ``dt=`` partition written (required)."""
    labels: Literal["graded", "positive"] = "graded"
    """``into=train``: ``graded`` pairs keep their grade 0-3 (the pointwise head learns
    them); ``positive`` keeps the pairs graded above 0, without a grade (the contrastive
    objective alone: a click log's positives)."""
    corpus: str = "products"
    """The corpus the labels judge. A ``beir`` import writes the folder's
    ``corpus.jsonl`` there when the store has no such corpus (else the store's stands)."""
    split: str = "test"
    """``beir``: the qrels read, ``qrels/{split}.tsv``; ``esci``: the rows of this
    ``split`` (a source without the column is read whole)."""
    locale: str | None = None
    """``esci``: only the rows of this ``product_locale`` (``us``, ``es``, ``jp``)."""
    max_missing: int = Field(default=0, ge=0)
    """Judged document ids the corpus does not hold that are tolerated (counted in the
    report); one more is refused, naming a row: such a document can never be found."""
    corpus_shard_rows: int = Field(default=50_000, ge=1)
    """``beir``: texts per part of the corpus written, the unit of the embed job's work."""

    @field_validator("dataset", "corpus", "split")
    @classmethod
    def _segment(cls, v: str) -> str:
        return safe_id(v, "name")

    @model_validator(mode="after")
    def _day(self) -> ImportLabelsConfig:
        if self.into == "train" and self.day is None:
            raise ValueError("into=train writes one day's partition: set day=YYYY-MM-DD")
        return self
