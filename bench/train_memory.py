"""Training memory and time per step by model size, on this CPU: the train job's peak
RSS against what one step must hold (weights, gradients, AdamW's two moments and the
activations autograd saves for one batch).

Run on demand, not in CI::

    .venv/bin/python bench/train_memory.py [--shapes minilm-l6,mpnet-base] [--steps 3]
        [--no-append]

Per shape: a sentence-transformers directory of that shape with random weights is built
(``tests/own_model.py``: no download), published with ``publish_model`` as a team
publishes its own model, and trained by ``python -m embedfresh.jobs.train`` for
``--steps`` steps at the model's own batch size and training length. The train report
gives the process's peak RSS (``VmHWM``) and samples/s. In this process, on the same
batches the job trains on (its own data order, trimmed as the eager backend trims them),
the bench counts the tensor bytes of the parameters (gradients: the same again; AdamW:
twice) and, through ``torch.autograd.graph.saved_tensors_hooks``, the bytes of the
distinct storages one forward saves for backward; the largest batch's is "activations".
Goal (issue 37): peak RSS within 1.5x of their sum.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import (
    NOISY,
    ROOT,
    bench_env,
    command_line,
    generate_data,
    machine,
    publish,
    section,
    table,
)

DAY = dt.date(2026, 1, 1)
GIB = 2**30

#: transformers config fields of each shape (random weights; the vocabulary the real
#: model's, so the embedding matrix is its size too).
SHAPES: dict[str, tuple[str, dict[str, int]]] = {
    "minilm-l6": (  # all-MiniLM-L6-v2 (BERT: the fast path)
        "bert",
        {
            "vocab_size": 30522,
            "hidden_size": 384,
            "num_hidden_layers": 6,
            "num_attention_heads": 12,
            "intermediate_size": 1536,
        },
    ),
    "mpnet-base": (  # all-mpnet-base-v2 (MPNet: the generic transformers path)
        "mpnet",
        {
            "vocab_size": 30527,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "pad_token_id": 1,
        },
    ),
}


def run(argv: list[str]) -> dict[str, Any]:
    """A job as its own process; its stdout summary."""
    done = subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, env=bench_env(len(os.sched_getaffinity(0))),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:1])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def step_tensors(root: str, name: str, steps: int) -> dict[str, float]:
    """Bytes of parameters and of the largest batch's saved activations (GiB), on the
    batches the job's first ``steps`` steps train on."""
    import torch

    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.reader import read_train
    from embedfresh.ml.data.schema import DEMO_FEATURES
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.relevance import in_batch_contrastive
    from embedfresh.ml.model.tokenizer import TextTokenizer
    from embedfresh.ml.training.data import RankBatches, TrainingSet

    store = ArtifactStore(root)
    version = versions.load(store, name, "base")
    model = versions.instantiate(version).train()
    spec = version.spec
    tokenizer = TextTokenizer(version.tokenizer_json, spec.max_length, spec.prompts)
    data = TrainingSet.build(
        read_train(store, "products", DAY, DAY + dt.timedelta(days=1), DEMO_FEATURES), tokenizer
    )
    batch_size = spec.default_batch_size
    per_epoch = len(data.labels) // batch_size
    largest, widths = 0, []
    for batch in RankBatches(data, 0, per_epoch, batch_size, 0, 1, 0, steps, trim=True):
        saved: dict[int, int] = {}

        def keep(t: torch.Tensor, saved: dict[int, int] = saved) -> torch.Tensor:
            storage = t.untyped_storage()
            saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            logits, q, p = model.score_and_embed(
                batch["query_ids"], batch["query_mask"], batch["product_ids"],
                batch["product_mask"], batch["features"],
            )  # fmt: skip
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["labels"])
            loss = loss + in_batch_contrastive(q, p, batch["labels"], 0.05)
        largest = max(largest, sum(saved.values()))
        widths.append(f"{batch['query_ids'].shape[1]}/{batch['product_ids'].shape[1]}")
        del loss, logits, q, p
    params = sum(t.numel() * t.element_size() for t in model.parameters())
    return {
        "parameters": sum(t.numel() for t in model.parameters()),
        "weights": params / GIB,
        "activations": largest / GIB,
        "widths": ", ".join(widths),
        "max_length": spec.max_length,
        "batch_size": batch_size,
    }


def bench_shape(tmp: Path, name: str, steps: int) -> dict[str, Any]:
    from tests.own_model import build_own_model  # the test's builder: no download

    model_type, shape = SHAPES[name]
    directory = build_own_model(tmp / name / "st", model_type, shape=shape)
    root = f"file://{(tmp / name / 'artifacts').resolve()}"
    generate_data(root, DAY, train_rows=max(512, 64 * steps))
    run(["embedfresh.jobs.publish_model", "--set", f"artifact_root={root}",
         "--set", f"model={name}", "--set", f"source={directory}"])  # fmt: skip
    summary = run(
        ["embedfresh.jobs.train", "--set", f"artifact_root={root}", "--set", f"model={name}",
         "--set", "run_id=memory", "--set", f"data_interval_start={DAY}",
         "--set", f"max_steps={steps}", "--set", "checkpoint_every=100000"]
    )  # fmt: skip
    from embedfresh.core.storage import ArtifactStore

    report = ArtifactStore(root).read_json(f"runs/{name}/memory/reports/train.json")
    tensors = step_tensors(root, name, steps)
    states = 4 * tensors["weights"]  # weights, gradients, AdamW exp_avg and exp_avg_sq
    peak = report["peak_rss_mib"] / 1024
    return {
        **tensors,
        "states": states,
        "peak": peak,
        "ratio": peak / (states + tensors["activations"]),
        "step_s": report["batch_size"] / summary["samples_per_second"],
        "padding": report["padding"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="minilm-l6,mpnet-base")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-train-memory-") as tmp:
        for name in args.shapes.split(","):
            print(f"benchmarking {name} ...", flush=True)
            r = bench_shape(Path(tmp), name, args.steps)
            rows.append(
                [
                    name,
                    f"{r['parameters'] / 1e6:.1f}M",
                    f"{r['batch_size']} x {r['max_length']}",
                    r["widths"],
                    f"{r['weights']:.2f}",
                    f"{r['states']:.2f}",
                    f"{r['activations']:.2f}",
                    f"{r['peak']:.2f}",
                    f"{r['ratio']:.2f}x",
                    f"{r['step_s']:.1f}",
                ]
            )
    headers = [
        "shape",
        "parameters",
        "batch x max_length",
        "widths of the steps (query/product)",
        "weights GiB",
        "weights + grads + AdamW GiB",
        "activations GiB (largest batch)",
        "peak RSS GiB",
        "peak / (states + activations)",
        "s/step",
    ]
    text = section(
        "Training memory by model size, cpu",
        [
            f"command: `{command_line()}`",
            f"machine: {machine()}",
            NOISY,
            f"{args.steps} steps of the train job per shape, random weights of the shape, "
            "the generated products data; goal: peak within 1.5x of states + activations",
        ],
        [table(headers, rows)],
    )
    publish(text, None if args.no_append else Path(ROOT / "docs" / "BENCHMARKS.md"))


if __name__ == "__main__":
    main()
