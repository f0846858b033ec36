"""The embed job: ``python -m embedfresh.jobs.embed --set version=v1 [--set shards=[0,1]]``.

Per corpus shard ``corpora/{corpus}/part-NNNNN.parquet`` it writes
``embeddings/{model}/{version}/{corpus}/part-NNNNN.parquet`` (id int64 or string, as in
the corpus; embedding fixed_size_list<float32>[hidden]; model_version string; rows in
the corpus order) and then the shard's commit marker ``part-NNNNN.COMMIT`` (sha256 and
size of the part, row count, truncated texts, timing and the shard's reuse key;
:mod:`embedfresh.core.markers`). Texts are cut at the model's own ``max_seq_length``
unless ``max_length`` says otherwise; any cut is logged as a warning and counted per
shard in the report.

A committed shard is reused only when its marker verifies and its reuse key
(:func:`embedfresh.core.shards.reuse_key`: the version's weights and tokenizer, the corpus
shard's content, the settings that change vectors, the output format) equals the
current one, so a retry redoes only the shards a killed task had not committed, and a
changed text, model or setting recomputes exactly the shards it touches; the report
lists each recomputed shard with the reason. ``_MANIFEST.json`` is written by the
verifier once every shard is in (:mod:`embedfresh.jobs.embed_verify`); this job removes a
stale one before it writes anything.

Before the model loads, every shard the task embeds is read and validated once (schema,
ids, texts) and ids repeated across them are refused, the ids kept on disk
(:class:`~embedfresh.core.shard_ids.CrossShardIds`): bad input fails with exit 2 before
the first write, in memory of one shard. A background thread then reads and tokenises
the next shard(s) while the current one is embedded (queue of ``prefetch`` shards).
Texts are bucketed by token length into a fixed set of padded lengths under a token
budget (:mod:`embedfresh.ml.embedding.bucketing`); on CPU/CUDA the batches run unpadded
(:mod:`embedfresh.ml.embedding.packed`). Memory is bounded by the shard size (at most
three shards in flight), never by the corpus: each commit logs the resident memory and
its peak so far, and the report carries ``peak_rss_mib``.
Writes ``runs/{model}/{run_id}/reports/embed-<corpus>[-<first>-<last>].json``.

The embeddings a kept release carries are immutable (its table and its search check were
made from them): when a shard of such a set would be recomputed (its corpus shard or a
setting changed), the job refuses (exit 2) and names the release; a refresh makes a new
release from the changed corpus instead.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedfresh.core import layout, markers
from embedfresh.core.cli import main_for
from embedfresh.core.config import EmbedConfig
from embedfresh.core.embed_plan import EmbedPlan, read_plan, slice_count, write_plan
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.memory import rss_mib
from embedfresh.core.parquet import job_memory_pool
from embedfresh.core.progress import Progress
from embedfresh.core.shard_ids import CrossShardIds
from embedfresh.core.shards import (
    CALIBRATION,
    MANIFEST,
    commit_name,
    corpus_shards,
    id_type,
    read_corpus_shard,
    reuse_key,
    stale_reason,
    version_digest,
)
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.embedding.bucketing import Plan, VariableTokenizer, make_batches, padded_lengths
from embedfresh.ml.embedding.encode import EncodeStats, embed_plan, uses_packed
from embedfresh.ml.embedding.query import calibration_digest, calibration_texts, vector_settings

log = logging.getLogger("embedfresh.jobs.embed")


@dataclass(frozen=True)
class PreparedShard:
    index: int
    ids: np.ndarray
    plan: Plan
    truncated: int
    read_seconds: float


def output_schema(hidden: int, ids: pa.DataType) -> pa.Schema:
    """An embedding part: ``ids`` is the corpus's id type (int64 or string)."""
    return pa.schema(
        [
            pa.field("id", ids, nullable=False),
            pa.field("embedding", pa.list_(pa.float32(), hidden), nullable=False),
            pa.field("model_version", pa.string(), nullable=False),
        ]
    )


def shard_bytes(ids: np.ndarray, vectors: np.ndarray, version: str) -> bytes:
    n, hidden = vectors.shape
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    table = pa.Table.from_arrays(
        [
            pa.array(ids, id_type(ids)),
            pa.FixedSizeListArray.from_arrays(flat, hidden),
            pa.array([version] * n, pa.string()),
        ],
        schema=output_schema(hidden, id_type(ids)),
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


class _Prefetcher:
    """Runs ``load`` over ``items`` in a thread, at most ``depth`` results ahead."""

    _DONE = object()

    def __init__(self, items: list[Any], load: Callable[[Any], Any], depth: int) -> None:
        self._items = items
        self._load = load
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="embed-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        for item in self._items:
            if self._stop.is_set():
                return
            try:
                result = self._load(item)
            except BaseException as e:  # handed to the consumer, re-raised there
                self._put(e)
                return
            if not self._put(result):
                return
        self._put(self._DONE)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=30)


def embed(cfg: EmbedConfig) -> dict[str, Any]:
    """Embed corpus shards with a model version; skip shards already committed."""
    # Arrow on the C allocator: its default pool's high-water mark creeps with the number
    # of shards read.
    with job_memory_pool():
        return _embed(cfg)


def _embed(cfg: EmbedConfig) -> dict[str, Any]:
    # Store, model version, shards, settings and what is reused: every check of the
    # input passes before the first write.
    run = EmbedRun.plan(cfg)
    if cfg.mode == "plan":
        return _write_plan(run.store, cfg, run.out_dir, run.status, run.started)
    # The model on its device, behind the fast mode's gate when one is asked for (a
    # refusal writes its report and nothing else), then one shard after another, each
    # part published with its commit marker.
    run.load_model()
    run.embed_shards()
    report = run.report()
    run.store.write_json(run.report_rel, report)
    return run.summary()


class EmbedRun:
    """One embed task: its plan (:meth:`plan`), its model (:meth:`load_model`), its
    shards (:meth:`embed_shards`) and its report (:meth:`report`)."""

    def __init__(self, cfg: EmbedConfig) -> None:
        from embedfresh.ml.backends import get_backend
        from embedfresh.ml.model import versions

        self.cfg, self.started = cfg, time.perf_counter()
        self.store = ArtifactStore(cfg.artifact_root)
        # An array child reads its plan and picks its slice first: a wrong index or plan
        # fails (exit 2) before the model is loaded or anything is written.
        self.child_plan = _child_plan(self.store, cfg) if cfg.plan and cfg.mode == "embed" else None
        self.backend = get_backend(cfg.backend) if cfg.mode == "embed" else None
        self.version = versions.load(self.store, cfg.model, cfg.version)
        self.spec = self.version.spec
        self.hidden = self.spec.embedding_dim
        self.max_length = self.spec.check_embedding_length(
            cfg.max_length or self.spec.embedding_max_length
        )
        self.lengths = padded_lengths(cfg.lengths, self.max_length)
        self.version_marker = versions.is_committed(self.store, cfg.model, cfg.version) or {}
        self.corpus_dir = layout.corpus(cfg.corpus)
        self.out_dir = layout.embeddings(cfg.model, cfg.version, cfg.corpus)
        self.totals = dict(rows=0, truncated=0, real_tokens=0, padded_tokens=0, batches=0)
        self.truncated_per_shard: dict[int, int] = {}
        self.embed_seconds = 0.0
        self.stats = EncodeStats()
        self.done: list[int] = []
        self.fast_gate: dict[str, Any] | None = None
        self.compiled: Any = None
        self.packed = False

    @classmethod
    def plan(cls, cfg: EmbedConfig) -> EmbedRun:
        """The shards wanted, which are reused and which embedded (logged), the vectors'
        settings; refuses bad shards and a change to a kept release's embeddings."""
        from embedfresh.ml.backends import resolve_name

        run = cls(cfg)
        store = run.store
        if run.child_plan is not None:
            # The planner listed the corpus once; a child names its own shards (10,000
            # children listing 100,000 names each would be 1M LIST requests).
            run.wanted = run.child_plan.slice(int(cfg.array_index or 0))
            run.available = {i: layout.part_name(i) for i in run.wanted}
            # int8 is calibrated on the corpus's first shard, whatever this task embeds:
            # every task, array child and re-run after a kill then builds the same int8
            # model, so the parts of one output never come from two calibrations.
            calibration_shard = min(run.child_plan.shards + run.child_plan.reused)
        else:
            run.available = corpus_shards(store, cfg.corpus)
            run.wanted = list(run.available) if cfg.shards is None else cfg.shards
            calibration_shard = min(run.available)
        unknown = [i for i in run.wanted if i not in run.available]
        if unknown:
            raise BadInputError(
                f"shards {unknown} do not exist in corpus {store.url(run.corpus_dir)} "
                f"(it has {len(run.available)} shards: {list(run.available)[:10]}...)"
            )
        # The texts int8 is calibrated on, pinned by their sha256 in every part's settings
        # and copied beside the parts (the release's query encoder reads the copy).
        run.calibration = (
            calibration_texts(store, f"{run.corpus_dir}/{layout.part_name(calibration_shard)}",
                              run.spec.prompt("document"))
            if cfg.quantize == "int8" else None
        )  # fmt: skip
        # The planner names the backend without building it: it may plan on a host
        # without the job's device.
        run.settings = vector_settings(
            run.spec,
            run.max_length,
            cfg.quantize,
            run.backend.name if run.backend is not None else resolve_name(cfg.backend),
            layout.part_name(calibration_shard),
            calibration_digest(run.calibration) if run.calibration is not None else None,
        )
        run.status = shard_status(
            store,
            corpus_dir=run.corpus_dir,
            out_dir=run.out_dir,
            available=run.available,
            wanted=run.wanted,
            version_marker=run.version_marker,
            settings=run.settings,
            # The planner checks each part's size (a HEAD); the child that embeds a shard
            # streams it through its sha256 before reusing it (every byte of every part
            # read once per run would be the corpus's whole output through one host).
            full_check=cfg.mode == "embed",
        )
        if run.status.todo:
            _refuse_to_change_a_release(store, cfg, run.status.todo, run.status.recomputed)
        run._log_reuse()
        return run

    def _log_reuse(self) -> None:
        status = self.status
        for item in status.recomputed:
            log.warning("shard %d is recomputed: %s", item["shard"], item["reason"])
        if not status.skipped:
            return
        log.info("%d shard(s) committed and current in %s: reused (%s), %d rows",
                 len(status.skipped), self.store.url(self.out_dir), _ranges(status.skipped),
                 status.reused_rows)  # fmt: skip
        if status.reused_truncated:
            log.warning(
                "%d texts of the reused shards were truncated when they were embedded "
                "(their commit markers; counted in the report as truncated_reused)",
                status.reused_truncated,
            )

    def load_model(self) -> None:
        """Before the model loads, the shards to embed are read and their ids checked
        across shards (on disk: memory does not grow with the corpus); then the model,
        its fast mode gated, its compiled forward; a stale manifest is removed."""
        from embedfresh.ml.model import versions

        cfg, store, todo = self.cfg, self.store, self.status.todo
        self.report_rel = layout.report(cfg.model, cfg.run_id, cfg.report_kind)
        self.todo_rows = _refuse_repeated_ids(store, self.corpus_dir, self.available, todo)
        self.tokenizer = VariableTokenizer(self.version.tokenizer_json, self.max_length)
        self.model = versions.instantiate(self.version).to(self.backend.device)
        self.model.eval()
        if cfg.quantize != "none":
            self.model, self.fast_gate = _fast_mode_or_refuse(
                cfg, store, self.model, self.backend, self.tokenizer, self.lengths,
                self.calibration, bool(todo),
            )  # fmt: skip
            if self.fast_gate is not None and self.fast_gate["verdict"] != "PASS":
                self._refuse_fast_mode()
            if self.calibration is not None and todo:  # gate passed: the set's first write
                _copy_calibration(store, self.out_dir, self.calibration, self.settings)
        self.packed = uses_packed(self.model, self.backend, cfg.packed)  # the fast mode's
        if todo:
            self.compiled = _compiled_forward(
                cfg, self.model, self.backend, self.version_marker, self.lengths
            )
        if todo and store.exists(f"{self.out_dir}/{MANIFEST}"):
            log.info("removing stale %s: shards %s are (re)embedded", MANIFEST, _ranges(todo))
            try:
                store.remove(f"{self.out_dir}/{MANIFEST}")
            except FileNotFoundError:  # another child of the same array job was first
                pass

    def _refuse_fast_mode(self) -> None:
        """The fast mode's gate did not pass: its report, and exit 3 (nothing else written)."""
        cfg, gate, mode = self.cfg, self.fast_gate, self.cfg.quantize
        assert gate is not None and self.backend is not None
        self.store.write_json(
            self.report_rel,
            {"status": "refused", "model": cfg.model, "run_id": cfg.run_id,
             "version": cfg.version, "corpus": cfg.corpus, "quantize": mode,
             f"{mode}_gate": gate, "shards_requested": self.wanted, "shards_done": [],
             "shards_skipped": self.status.skipped, **self.backend.metadata()},
        )  # fmt: skip
        raise GateRefusedError(
            f"{mode} embeddings refused by the {mode} quality gate "
            f"({gate['verdict']}): {gate['gate']['reason']}; recall@10 {mode} "
            f"{gate[f'recall_at_10_{mode}']} vs fp32 {gate['recall_at_10_fp32']} "
            f"on {gate['n_queries']} eval queries of dataset {cfg.dataset!r}. "
            f"Nothing was written to {self.store.url(self.out_dir)}; embed with quantize=none"
            + (
                ", or give the gate an eval split as large as it asks for (dataset=...)"
                if gate["verdict"] == "INCONCLUSIVE"
                else ""
            )
            + f" (report: {self.store.url(self.report_rel)})"
        )

    def _prepare(self, index: int) -> PreparedShard:
        """A shard read, prompted, tokenised and batched (on the prefetch thread)."""
        t0 = time.perf_counter()
        ids, texts = read_corpus_shard(self.store, f"{self.corpus_dir}/{self.available[index]}")
        prompt = self.spec.prompt("document")
        if prompt:  # the model's document prompt, as encode_document puts it
            texts = [prompt + t for t in texts]
        token_ids, truncated = self.tokenizer(texts)
        plan = make_batches(
            token_ids, self.lengths, self.cfg.token_budget, static=self.cfg.static_batches
        )
        return PreparedShard(index, ids, plan, truncated, time.perf_counter() - t0)

    def embed_shards(self) -> None:
        """Embed and commit each shard to do, the next one read while one is embedded."""
        cfg, todo = self.cfg, self.status.todo
        progress = Progress(
            f"embedding {cfg.corpus} with {cfg.model} {cfg.version}", self.todo_rows, log=log
        )
        forward = None if self.compiled is None else self.compiled.forward
        prefetcher = _Prefetcher(todo, self._prepare, cfg.prefetch)
        try:
            for shard in prefetcher:
                t0 = time.perf_counter()
                vectors = embed_plan(self.model, self.backend, shard.plan, len(shard.ids),
                                     self.hidden, self.stats, cfg.packed, forward=forward,
                                     progress=progress)  # fmt: skip
                self._commit(shard, vectors, time.perf_counter() - t0)
        finally:
            prefetcher.close()
        if todo:
            progress.finish()

    def _commit(self, shard: PreparedShard, vectors: np.ndarray, seconds: float) -> None:
        """Publish one shard's part and commit marker; count it."""
        cfg, n = self.cfg, len(shard.ids)
        self.embed_seconds += seconds
        markers.publish(
            self.store,
            self.out_dir,
            {layout.part_name(shard.index): shard_bytes(shard.ids, vectors, cfg.version)},
            meta={
                "kind": "embedding-shard",
                "shard": shard.index,
                "rows": n,
                "hidden": self.hidden,
                "model": cfg.model,
                "version": cfg.version,
                "corpus": cfg.corpus,
                "source": self.store.url(f"{self.corpus_dir}/{self.available[shard.index]}"),
                "embed_seconds": round(seconds, 6),
                "truncated": shard.truncated,
                "real_tokens": shard.plan.real_tokens,
                "padded_tokens": shard.plan.padded_tokens,
                "quantize": cfg.quantize,
                "max_length": self.max_length,
                "reuse_key": self.status.keys[shard.index],
                "run_id": cfg.run_id,
            },
            name=commit_name(shard.index),
        )
        if shard.truncated:
            log.warning("shard %d: %d of %d texts are longer than %d tokens and were truncated",
                        shard.index, shard.truncated, n, self.max_length)  # fmt: skip
        log.info("shard %d committed: %d rows in %.3f s (%.0f rows/s, %d truncated, RSS %.1f "
                 "MiB, peak RSS %.1f MiB)", shard.index, n, seconds, n / max(seconds, 1e-9),
                 shard.truncated, *rss_mib())  # fmt: skip
        self.done.append(shard.index)
        if self.compiled is not None:
            self.compiled.store_entry()  # the graphs of the first shard's buckets
        self.totals["rows"] += n
        self.totals["truncated"] += shard.truncated
        self.truncated_per_shard[shard.index] = shard.truncated
        self.totals["real_tokens"] += shard.plan.real_tokens
        self.totals["padded_tokens"] += shard.plan.padded_tokens
        self.totals["batches"] += len(shard.plan.batches)

    def report(self) -> dict[str, Any]:
        """The task's report (a list of facts; its length is the facts', not logic's)."""
        cfg, totals, status, backend = self.cfg, self.totals, self.status, self.backend
        assert backend is not None
        wall = time.perf_counter() - self.started
        if totals["truncated"]:
            log.warning(
                "%d of %d texts were truncated at %d tokens (max_length; the model's own is %d)",
                totals["truncated"], totals["rows"], self.max_length,
                self.spec.embedding_max_length,
            )  # fmt: skip
        compiled, seconds = self.compiled, self.embed_seconds
        return {
            "status": "ok",
            "model": cfg.model,
            "run_id": cfg.run_id,
            "version": cfg.version,
            "plan": self.store.url(cfg.plan) if cfg.plan else None,
            "array_index": cfg.array_index,
            "version_url": self.version.url,
            "corpus": cfg.corpus,
            "output": self.store.url(self.out_dir),
            "shards_requested": self.wanted,
            "shards_done": self.done,
            "shards_skipped": status.skipped,
            "shards_recomputed": status.recomputed,
            **totals,
            "rows_reused": status.reused_rows,
            "truncated_reused": status.reused_truncated,
            "truncated_per_shard": {str(i): c for i, c in self.truncated_per_shard.items()},
            "padding_efficiency": (
                round(totals["real_tokens"] / totals["padded_tokens"], 6)
                if totals["padded_tokens"]
                else None
            ),
            "sentences_per_s": round(totals["rows"] / seconds, 3) if seconds else None,
            "rows_per_s_wall": round(totals["rows"] / wall, 3) if totals["rows"] else None,
            "embed_seconds": round(seconds, 6),
            "wall_seconds": round(wall, 3),
            "peak_rss_mib": round(rss_mib()[1], 1),
            "max_length": self.max_length,
            "model_max_seq_length": self.spec.embedding_max_length,
            "lengths": list(self.lengths),
            "token_budget": cfg.token_budget,
            "static_batches": cfg.static_batches,
            # Which forward ran: packed (our BERT encoder on its real tokens) or padded
            # (XLA/Neuron static shapes, or the generic transformers path of other
            # encoders); int8's graphs are compiled by its own route (PT2E, inductor).
            "packed": self.packed and compiled is None,
            "forward": "compiled"
            if compiled is not None or cfg.quantize == "int8"
            else "packed"
            if self.packed
            else "padded",
            **({"compile": compiled.report()} if compiled is not None else {}),
            "shapes": sorted([list(s) for s in self.stats.shapes]),
            # Graph compiles (XLA CompileTime, dynamo frames): bounded by the static shapes.
            "compiles": backend.compiles(),
            "quantize": cfg.quantize,
            **({f"{cfg.quantize}_gate": self.fast_gate} if cfg.quantize != "none" else {}),
            **backend.metadata(),
        }

    def summary(self) -> dict[str, Any]:
        """The job's one-line stdout summary."""
        status = self.status
        return {
            "status": "ok",
            **(_child_facts(self.cfg) if self.cfg.plan else {}),
            "rows": self.totals["rows"],
            "truncated": self.totals["truncated"],
            "rows_reused": status.reused_rows,
            "truncated_reused": status.reused_truncated,
            "shards_done": self.done,
            "shards_skipped": status.skipped,
            "shards_recomputed": [r["shard"] for r in status.recomputed],
            "output": self.store.url(self.out_dir),
            "report": self.store.url(self.report_rel),
        }


def _compiled_forward(
    cfg: EmbedConfig,
    model: Any,
    backend: Any,
    version_marker: dict[str, Any],
    lengths: tuple[int, ...],
) -> Any:
    """The encoder compiled (``compile=true``), its cache entry restored; None otherwise.

    :raises BadInputError: compile on a backend other than cpu/cuda (XLA and Neuron
        compile their graphs themselves).
    """
    if not cfg.compile:
        return None
    if backend.device.type not in ("cpu", "cuda"):
        raise BadInputError(
            f"compile=true is torch.compile on the cpu and cuda backends; backend "
            f"{backend.name!r} compiles its graphs itself: drop compile=true"
        )
    from embedfresh.ml.embedding import compiled

    parts = compiled.key_parts(
        version_digest(version_marker),
        backend,
        lengths,
        cfg.token_budget,
        cfg.quantize if cfg.quantize == "bf16" else "fp32",
    )
    if backend.device.type == "cuda":
        log.warning(
            "compile=true on cuda: inductor picks its GPU kernels by timing them, so graphs "
            "compiled by two processes can sum in another order: parts embedded by a "
            "re-run or by another task are not byte-equal to a clean run's (measured on an "
            "H200: 0 of 4 parts; the eager forward's 4 of 4), though as close to "
            "sentence-transformers fp32 as the eager forward's (cosine >= 0.99996). "
            "compile=false keeps them byte-equal"
        )
    cache = ArtifactStore(cfg.compile_cache_root or cfg.artifact_root)
    encoder = compiled.CompiledEncoder(model, backend, cache, parts)
    log.info(
        "compile=true: encoder forward under torch.compile, one graph per bucket %s; "
        "compile-cache entry %s: %s",
        list(lengths),
        encoder.key,
        "restored"
        if encoder.cache["hit"]
        else "none yet, compiling (stored after the first shard)",
    )
    return encoder


@dataclass(frozen=True)
class ShardStatus:
    """Which of the wanted shards are reused and which are (re)embedded, and why."""

    keys: dict[int, dict[str, Any]]
    skipped: list[int]
    todo: list[int]
    recomputed: list[dict[str, Any]]
    reused_rows: int = 0
    """Rows of the skipped shards (their markers)."""
    reused_truncated: int = 0
    """Texts truncated in the skipped shards when they were embedded (their markers): a
    re-run's report counts the cuts in its output, not only in what it embedded."""


#: Shards whose key and marker are read at once (each is two HEADs and one GET on S3).
STATUS_THREADS = 16


def shard_status(
    store: ArtifactStore,
    *,
    corpus_dir: str,
    out_dir: str,
    available: dict[int, str],
    wanted: list[int],
    version_marker: dict[str, Any],
    settings: dict[str, Any],
    full_check: bool = True,
) -> ShardStatus:
    """The reuse rule, one place for the embed job and its planner.

    A committed shard is reused only when its marker's reuse key equals the current one
    (:func:`~embedfresh.core.shards.stale_reason`) and its part checks out: every byte
    through its sha256 (``full_check``, what the job does before it skips a shard), or
    only each listed object's size (the planner: a HEAD a shard).
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[int, dict[str, Any], str | None, dict[str, Any]]:
        key = reuse_key(
            store=store,
            source_rel=f"{corpus_dir}/{available[i]}",
            version_marker=version_marker,
            settings=settings,
        )
        marker = markers.read_marker(store, out_dir, commit_name(i))
        reason = stale_reason(marker, key)
        if reason is None and full_check:
            check = markers.verify(store, out_dir, commit_name(i), marker=marker)
            reason = None if check.ok else f"output does not verify: {check.reason}"
        elif reason is None:
            reason = _size_problem(store, out_dir, marker or {})
        return i, key, reason, marker or {}

    with ThreadPoolExecutor(max_workers=max(1, min(STATUS_THREADS, len(wanted)))) as pool:
        results = list(pool.map(one, wanted))
    keys: dict[int, dict[str, Any]] = {}
    skipped, todo, recomputed = [], [], []
    reused_rows = reused_truncated = 0
    for i, key, reason, marker in results:
        keys[i] = key
        if reason is None:
            skipped.append(i)
            reused_rows += int(marker.get("rows", 0))
            reused_truncated += int(marker.get("truncated", 0))
            continue
        todo.append(i)
        if reason != "not committed":
            recomputed.append({"shard": i, "reason": reason})
    return ShardStatus(keys, skipped, todo, recomputed, reused_rows, reused_truncated)


def _size_problem(store: ArtifactStore, out_dir: str, marker: dict[str, Any]) -> str | None:
    for name, entry in sorted(marker.get("files", {}).items()):
        try:
            size = store.size(f"{out_dir}/{name}")
        except FileNotFoundError:
            return f"output does not verify: {name} is missing"
        if size != entry.get("size"):
            return (
                f"output does not verify: {name} has {size} bytes, marker says {entry.get('size')}"
            )
    return None


def _child_facts(cfg: EmbedConfig) -> dict[str, Any]:
    """An array child's index, and the Batch attempt that embedded its slice (a retried
    child says 2 or more), for the operator's combined summary."""
    facts: dict[str, Any] = {"array_index": cfg.array_index}
    attempt = os.environ.get("AWS_BATCH_JOB_ATTEMPT", "").strip()
    if attempt.isdigit():
        facts["aws_batch_job_attempt"] = int(attempt)
    return facts


def _child_plan(store: ArtifactStore, cfg: EmbedConfig) -> EmbedPlan:
    """The plan this array child was submitted with, checked against its own config.

    :raises BadInputError: no such plan, not the bytes it was submitted with, another
        model/version/corpus/run's plan, or an index outside the plan's slices.
    """
    assert cfg.plan is not None
    plan = read_plan(store, cfg.plan, cfg.plan_sha256)
    mine = (cfg.model, cfg.version, cfg.corpus, cfg.run_id)
    theirs = (plan.model, plan.version, plan.corpus, plan.run_id)
    if mine != theirs:
        raise BadInputError(
            f"embed plan {store.url(cfg.plan)} is for model/version/corpus/run {theirs}, "
            f"this job is {mine}"
        )
    index = int(cfg.array_index or 0)
    shards = plan.slice(index)  # raises BadInputError outside 0..slices-1
    log.info(
        "array child %d of %d: %d shard(s) of plan %s (%s)",
        index,
        plan.slices,
        len(shards),
        store.url(cfg.plan),
        _ranges(shards),
    )
    return plan


def _write_plan(
    store: ArtifactStore, cfg: EmbedConfig, out_dir: str, status: ShardStatus, started: float
) -> dict[str, Any]:
    """``mode=plan``: write the plan of the pending shards; embed nothing."""
    assert cfg.plan is not None
    todo, skipped, recomputed = status.todo, status.skipped, status.recomputed
    slices = slice_count(len(todo), cfg.max_children) if todo else 0
    plan = EmbedPlan(
        model=cfg.model,
        version=cfg.version,
        corpus=cfg.corpus,
        run_id=cfg.run_id,
        shards=sorted(todo),
        slices=slices,
        reused=sorted(skipped),
        recomputed=recomputed,
        reused_rows=status.reused_rows,
        reused_truncated=status.reused_truncated,
    )
    sha = write_plan(store, cfg.plan, plan)
    log.info(
        "plan %s: %d shard(s) pending (%s) in %d slice(s), %d reused, %d recomputed",
        store.url(cfg.plan),
        len(todo),
        _ranges(sorted(todo)),
        slices,
        len(skipped),
        len(recomputed),
    )
    return {
        "status": "ok",
        "mode": "plan",
        "plan": cfg.plan,
        "plan_url": store.url(cfg.plan),
        "plan_sha256": sha,
        "slices": slices,
        "shards_pending": len(todo),
        "shards_reused": len(skipped),
        "rows_reused": status.reused_rows,
        "truncated_reused": status.reused_truncated,
        "shards_recomputed": len(recomputed),
        "output": store.url(out_dir),
        "wall_seconds": round(time.perf_counter() - started, 3),
    }


def _ranges(indices: list[int]) -> str:
    """``0-4, 7, 9-12``: a sorted shard list as the log shows it, short at any size."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(parts) > 12:
        return f"{', '.join(parts[:6])}, ... {len(parts) - 12} more ..., {', '.join(parts[-6:])}"
    return ", ".join(parts)


def _refuse_repeated_ids(
    store: ArtifactStore, corpus_dir: str, available: dict[int, str], shards: list[int]
) -> int:
    """Read and validate each of ``shards`` (:func:`read_corpus_shard`), one at a time,
    and refuse (exit 2) ids of two id types or ids repeated across them; their rows. The ids go to
    disk, hash-partitioned (:class:`~embedfresh.core.shard_ids.CrossShardIds`, as verify
    checks the whole corpus), so memory is one shard whatever the task's size; the cost
    is one more read of each shard (``prepare`` reads it again to embed it)."""
    if not shards:
        return 0
    started = time.perf_counter()
    with CrossShardIds() as on_disk:
        for index in shards:
            ids, _ = read_corpus_shard(store, f"{corpus_dir}/{available[index]}")
            on_disk.add(index, ids)
            if on_disk.mixed:
                (kept, first), (other, _) = on_disk.first_shard.items()
                raise BadInputError(
                    f"corpus shard {store.url(f'{corpus_dir}/{available[index]}')} has "
                    f"{other} ids, shard {available[first]} has {kept} ids: "
                    "one corpus, one id type"
                )
        found = on_disk.duplicates(examples=5)
        rows = on_disk.rows
    if found.count:
        where = ", ".join(store.url(f"{corpus_dir}/{available[i]}") for i in found.shards)
        raise BadInputError(
            f"corpus shards {where} share {found.count} ids (e.g. {found.examples}): ids "
            "must be unique across the shards to embed"
        )
    log.info(
        "read and validated %d shard(s) before embedding, %d ids, none repeated: %.1f s",
        len(shards),
        rows,
        time.perf_counter() - started,
    )
    return rows


def _refuse_to_change_a_release(
    store: ArtifactStore, cfg: EmbedConfig, todo: list[int], recomputed: list[dict]
) -> None:
    """A kept release's embeddings never change under it.

    :raises BadInputError: shards of a set a kept release carries would be (re)written.
    """
    from embedfresh.core.releases import releases_carrying

    carrying = releases_carrying(store, cfg.model, cfg.version, cfg.corpus)
    if carrying:
        why = "; ".join(f"shard {r['shard']}: {r['reason']}" for r in recomputed[:3])
        raise BadInputError(
            f"the embeddings of corpus {cfg.corpus!r} by {cfg.model} {cfg.version} are "
            f"carried by release(s) {', '.join(carrying)} and never change under them; "
            f"shards {_ranges(todo)} would be written ({why or 'missing'}): run a refresh, "
            "which releases a new version with the corpus as it is now"
        )


def _fast_mode_or_refuse(
    cfg: EmbedConfig,
    store: ArtifactStore,
    model: Any,
    backend: Any,
    tokenizer: VariableTokenizer,
    lengths: tuple[int, ...],
    calibration: list[str] | None,
    gated: bool,
) -> tuple[Any, dict[str, Any] | None]:
    """The fast mode's model (``cfg.quantize``) and its quality gate's summary (None when
    not ``gated``: no shard is left to embed, so nothing would be published).

    int8 is calibrated on ``calibration`` (the first texts of the corpus's first shard)
    and its summary says how (route, calibration tokens, int8 layers); bf16's says
    whether the device runs bf16 natively."""
    from embedfresh.ml.embedding.precision import fast_mode_gate, fast_model

    if not gated:  # nothing left to embed: no fast model to build
        return model, None
    fast, details = fast_model(model, backend, cfg.quantize, tokenizer, calibration)
    key = "bf16" if cfg.quantize == "bf16" else "quantization"
    _, summary = fast_mode_gate(
        store,
        cfg.dataset,
        model,
        fast,
        backend,
        tokenizer,
        lengths,
        cfg.token_budget,
        mode=cfg.quantize,
    )
    return fast, {**summary, key: details}


def _copy_calibration(
    store: ArtifactStore, out_dir: str, texts: list[str], settings: dict[str, Any]
) -> None:
    """The calibration texts beside the parts (once: every task of an output writes the
    same bytes), so the set's query encoder rebuilds this int8 model after the corpus
    shard they came from changed."""
    rel = f"{out_dir}/{CALIBRATION}"
    doc = {"shard": settings["int8_calibration"], "sha256": settings["int8_calibration_sha256"],
           "texts": texts}  # fmt: skip
    if not store.exists(rel) or store.read_json(rel) != doc:
        store.write_json(rel, doc)


if __name__ == "__main__":
    main_for("embed", EmbedConfig, embed)
