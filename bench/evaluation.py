"""What an evaluation costs: seconds per 10,000 judged queries, corpus documents and
eval pairs, for the gate's evaluation (embedfresh.ml.evaluation) on the demo's data.

    .venv/bin/python bench/evaluation.py --model tiny --repeats 3

Generates the demo's data set (24,000 products, complete judgments of 16,000 queries,
10,000 eval pairs) into a temporary store, publishes the model's base weights, and
times, ``--repeats`` times side by side, the three parts of an evaluation: embedding
the corpus (once per model and look), ranking and scoring the judged queries (embedding
them, exact search over the corpus, nDCG@10 and the rest), and the relevance head over
the pairs. Prints the medians and the spread; docs/BENCHMARKS.md keeps the figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "minilm"])
    parser.add_argument("--queries", type=int, default=16_000, help="judged queries ranked")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from embedfresh.core.config import EvaluateConfig
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.data.generate import write_dataset
    from embedfresh.ml.evaluation import VersionEval, head_outcomes
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    with tempfile.TemporaryDirectory() as tmp:
        root = f"file://{tmp}"
        store = ArtifactStore(root)
        generated = _timed(
            lambda: write_dataset(
                store,
                "products",
                0,
                dt.date(2026, 1, 1),
                1,
                64,
                10_000,
                "products",
                24_000,
                6_000,
                args.queries,
            )  # fmt: skip
        )
        spec = get_spec(args.model)
        model = versions.build_model(spec, 0)
        if spec.base_weights != "random":
            versions.load_base_weights(model)
        versions.publish(store, spec, "v", cpu_state_dict(model), {})
        ev = VersionEval.load(EvaluateConfig(artifact_root=root, run_id="b", version="v"))
        docs = ev.encoder.documents(ev.searcher.texts)  # warm-up
        n = min(args.queries, len(ev.searcher.judgments))
        rounds: dict[str, list[float]] = {"documents": [], "queries": [], "pairs": []}
        for _ in range(args.repeats):
            rounds["documents"].append(_timed(lambda: ev.encoder.documents(ev.searcher.texts)))
            rounds["queries"].append(_timed(lambda: ev.searcher.evaluate(ev.encoder, docs, 0, n)))
            rounds["pairs"].append(
                _timed(lambda: head_outcomes(ev.model, ev.backend, ev.pairs, 64))
            )
        counts = {
            "documents": len(ev.searcher.texts),
            "queries": n,
            "pairs": len(ev.pairs.examples),
        }
        out = {
            "model": args.model,
            "generate_seconds": round(generated, 1),
            "counts": counts,
            "seconds_per_10k": {
                k: {
                    "median": round(statistics.median(v) * 10_000 / counts[k], 2),
                    "min": round(min(v) * 10_000 / counts[k], 2),
                    "max": round(max(v) * 10_000 / counts[k], 2),
                }
                for k, v in rounds.items()
            },
        }
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
