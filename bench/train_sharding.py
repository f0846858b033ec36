"""Tensor memory per rank under ``parallelism`` ddp and fsdp, on cpu: what sharding
divides (weights, gradients, AdamW's two moments), for a model of 100M+ parameters.

Run on demand, not in CI::

    .venv/bin/python bench/train_sharding.py [--shape mpnet-base] [--ranks 2,4]
        [--steps 2] [--batch-size 4] [--no-append]

A sentence-transformers directory of the shape with random weights is built
(``tests/own_model.py``: no download) and published with ``publish_model`` as a team
publishes its own model; then, for each rank count N and each parallelism, the train job
runs under the project's launcher (``python -m embedfresh.jobs.launch --nproc-per-node
N``) for ``--steps`` steps. The train report records every rank's bytes of weights,
gradients and optimizer state after the last step (``tensor_bytes_per_rank``: a DTensor
counted by its local shard) and rank 0's peak RSS. Goal (issue 37): a rank under fsdp
holds within 10% of 1/N of what a ddp rank holds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    bench_env,
    command_line,
    generate_data,
    machine,
    publish,
    section,
    table,
)
from train_memory import SHAPES

DAY = dt.date(2026, 1, 1)
GIB = 2**30
PARTS = ("weights", "gradients", "optimizer")


def train(
    root: str, name: str, ranks: int, parallelism: str, steps: int, batch: int
) -> dict[str, Any]:
    """The train job under the launcher; its report."""
    run_id = f"{parallelism}-{ranks}"
    cmd = [sys.executable, "-m", "embedfresh.jobs.launch", "--standalone",
           "--nproc-per-node", str(ranks), "-m", "embedfresh.jobs.train"]  # fmt: skip
    for s in (f"artifact_root={root}", f"model={name}", f"run_id={run_id}",
              f"data_interval_start={DAY}", f"max_steps={steps}", f"batch_size={batch}",
              "checkpoint_every=100000", f"parallelism={parallelism}"):  # fmt: skip
        cmd += ["--set", s]
    done = subprocess.run(cmd, cwd=ROOT, env=bench_env(1), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{run_id} failed:\n{done.stderr[-3000:]}")
    path = Path(root.removeprefix("file://"), "runs", name, run_id, "reports/train.json")
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="mpnet-base", choices=sorted(SHAPES))
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4, help="per rank")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    from tests.own_model import build_own_model  # the test's builder: no download

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-train-sharding-") as tmp:
        model_type, shape = SHAPES[args.shape]
        directory = build_own_model(Path(tmp) / "st", model_type, shape=shape)
        root = f"file://{(Path(tmp) / 'artifacts').resolve()}"
        generate_data(root, DAY, train_rows=512)
        done = subprocess.run(
            [sys.executable, "-m", "embedfresh.jobs.publish_model", "--set", f"artifact_root={root}",
             "--set", f"model={args.shape}", "--set", f"source={directory}"],
            cwd=ROOT, env=bench_env(1), capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        for ranks in (int(n) for n in args.ranks.split(",")):
            reports = {}
            for parallelism in ("ddp", "fsdp"):
                print(f"{args.shape}: {parallelism} on {ranks} ranks ...", flush=True)
                reports[parallelism] = train(
                    root, args.shape, ranks, parallelism, args.steps, args.batch_size
                )
            whole = reports["ddp"]["tensor_bytes_per_rank"][0]
            for parallelism, report in reports.items():
                per_rank = report["tensor_bytes_per_rank"]
                worst = max(sum(r[p] for p in PARTS) for r in per_rank)
                ratio = worst / sum(whole.values())
                rows.append(
                    [
                        parallelism,
                        ranks,
                        *(f"{max(r[p] for r in per_rank) / GIB:.3f}" for p in PARTS),
                        f"{worst / GIB:.3f}",
                        f"{ratio:.3f}",
                        f"{(ratio * ranks if parallelism == 'fsdp' else 1.0):.3f}",
                        f"{report['peak_rss_mib'] / 1024:.2f}",
                    ]
                )
    headers = [
        "parallelism",
        "ranks N",
        "weights GiB / rank",
        "gradients GiB / rank",
        "AdamW state GiB / rank",
        "total GiB / rank",
        "vs ddp",
        "vs 1/N of ddp",
        "rank 0 peak RSS GiB",
    ]
    text = section(
        f"Tensor memory per rank: ddp against fsdp, {args.shape}, cpu",
        [
            f"command: `{command_line()}`",
            f"machine: {machine()}",
            "measured on a shared 2-core box; tensor bytes do not move with its load "
            "(one run per row)",
            f"the train job under `embedfresh.jobs.launch`, {args.steps} steps, batch "
            f"{args.batch_size} a rank; bytes after the last step, the largest rank's; "
            "goal: fsdp within 10% of 1/N of ddp (the last column within 0.9-1.1)",
        ],
        [table(headers, rows)],
    )
    publish(text, None if args.no_append else Path(ROOT / "docs" / "BENCHMARKS.md"))


if __name__ == "__main__":
    main()
