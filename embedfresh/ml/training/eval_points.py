"""Evaluation of the current weights at points during training (``eval_every``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from embedfresh.core import layout
from embedfresh.core.config import TrainConfig
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.backends import Backend
from embedfresh.ml.model.presets import ModelSpec
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.tokenizer import TextTokenizer
from embedfresh.ml.training.state import rng_state, set_rng_state

# The train job's logger: its log lines read the same wherever the code lives.
log = logging.getLogger("embedfresh.jobs.train")


class EvalPoints:
    """Evaluation of the current weights during training (``TrainConfig.eval_every``).

    Each point writes ``reports/eval-step-{step:08d}.json`` with its outcomes, in the
    evaluate job's format, and appends ``{step, metrics}`` to the curve. It must not
    change training: the RNG state (torch's and the device's; an XLA device advances its
    seed at every sync) is saved before and restored after, and the model is put back in
    train mode. Graph compilations it causes are counted apart (``compiles``).

    :param curve: the run's evaluation curve (``TrainState.eval_curve``), appended to
        in place; a point evaluated again after a resume replaces its entry.

    A sharded model evaluates on every rank at once (each forward gathers the blocks'
    shards), so every rank calls it; rank 0 alone writes the report and the curve.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        store: ArtifactStore,
        backend: Backend,
        tokenizer: TextTokenizer,
        spec: ModelSpec,
        tokenizer_json: bytes,
        curve: list[dict[str, Any]],
    ) -> None:
        from embedfresh.ml.evaluation import Pairs, Searcher  # noqa: PLC0415 - when evaluating

        self.cfg, self.store, self.backend = cfg, store, backend
        self.spec, self.tokenizer_json = spec, tokenizer_json
        self.pairs = Pairs.load(store, cfg.dataset, tokenizer, spec.features)
        self.searcher = Searcher.load(store, cfg.dataset, None)
        self.curve = curve
        self.compiles = 0
        self.seconds = 0.0

    def due(self, done: int, total: int) -> bool:
        """Every ``eval_every`` steps, and after the last one."""
        return done % self.cfg.eval_every == 0 or done == total

    def __call__(self, model: RelevanceModel, done: int, version: str) -> None:
        from embedfresh.ml.embedding.query import TextEncoder  # noqa: PLC0415
        from embedfresh.ml.evaluation import evaluate_model, write_outcomes  # noqa: PLC0415

        started = time.perf_counter()
        compiles_before = self.backend.compiles()
        saved = rng_state(self.backend)
        # The embed job's route at the model's own embedding length; the unpacked
        # forward (``embed``), which a sharded model reaches.
        encoder = TextEncoder(
            model, self.backend, self.tokenizer_json, self.spec,
            self.spec.embedding_max_length, self.spec.prompt("document"), packed=False,
        )  # fmt: skip
        try:
            metrics, tables, _ = evaluate_model(
                model, self.backend, self.pairs, self.searcher, encoder,
                self.cfg.eval_batch_size, self.cfg.eval_queries,
            )  # fmt: skip
        finally:
            set_rng_state(saved, self.backend)
            model.train()
        self.compiles += self.backend.compiles() - compiles_before
        if not self.backend.is_main:
            return
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
                "n_examples": len(self.pairs),
                "n_queries": len(tables["queries"]["query_id"]),
                "corpus": self.searcher.corpus,
                "outcomes": outcomes,
                "wall_seconds": round(seconds, 3),
                **self.backend.metadata(),
            },
        )
        self.curve[:] = [p for p in self.curve if p["step"] != done]
        self.curve.append({"step": done, "metrics": metrics})
        log.info("eval at step %d: %s", done, metrics)
