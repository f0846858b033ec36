"""Data parallel on this CPU: training samples/s of the real train job with 1 and 2
processes (``torchrun``, gloo), at the same global batch and the same 2 cores.

Run on demand, not in CI::

    .venv/bin/python bench/data_parallel.py [--models tiny] [--steps 60] [--rounds 3]
        [--no-append]

Each variant is the real job, ``python -m embedfresh.jobs.train`` with ``max_steps``, no checkpoint
and no evaluation inside the timed steps; samples/s is the train report's
``samples_per_second`` (steps x batch per rank x ranks over the loop's wall time; the
first step is included, so ``--steps`` keeps it small). The variants, interleaved round
by round, each with a fresh run id:

- ``1 x 1 thread``: one process, one intra-op thread, batch B (the per-core baseline);
- ``1 x 2 threads``: one process, two threads, batch 2B (the whole machine, one rank);
- ``2 x 1 thread``: ``torchrun --nproc-per-node 2``, gloo, one thread each, B per rank
  (global 2B: the same optimisation as the line above).

The last two use both cores and the same global batch: the fair comparison on a 2-core
box. ``2 x 1`` over ``1 x 1`` is the scaling figure (ideal 2.0x).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BENCHMARKS,
    NOISY,
    ROOT,
    bench_env,
    command_line,
    generate_data,
    interleaved,
    machine,
    median,
    publish,
    section,
    table,
)

DAY = dt.date(2026, 1, 1)
BATCH = 32
#: (label, processes, threads per process)
VARIANTS = (("1 x 1 thread", 1, 1), ("1 x 2 threads", 1, 2), ("2 x 1 thread (gloo)", 2, 1))


def free_port() -> int:
    """A port free on 127.0.0.1 now. Not ``--master-port 0``: torchrun 2.9.1 then hands
    ``MASTER_PORT=0`` to its workers (with ``TORCHELASTIC_USE_AGENT_STORE=True``) and
    both ranks wait forever in ``init_process_group`` (seen here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_command(procs: int) -> list[str]:
    if procs == 1:
        return [sys.executable, "-m", "embedfresh.jobs.train"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(procs),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "embedfresh.jobs.train",
    ]


class Variant:
    """One way to run the train job; each call is a fresh run, returning samples/s."""

    def __init__(self, root: str, model: str, procs: int, threads: int, steps: int) -> None:
        self.root, self.model, self.procs, self.threads, self.steps = (
            root,
            model,
            procs,
            threads,
            steps,
        )
        self.runs = 0
        self.walls: list[float] = []

    @property
    def per_rank_batch(self) -> int:
        # One process gets the global batch of the 2-process run when it has 2 threads.
        return BATCH * (2 if self.procs == 1 and self.threads == 2 else 1)

    def __call__(self) -> float:
        self.runs += 1
        run_id = f"dp-{self.model}-{self.procs}x{self.threads}-{self.runs}"
        cmd = train_command(self.procs)
        for s in (
            f"artifact_root={self.root}",
            f"model={self.model}",
            f"run_id={run_id}",
            f"data_interval_start={DAY}",
            "init=base",
            "epochs=100",
            f"max_steps={self.steps}",
            f"batch_size={self.per_rank_batch}",
            f"checkpoint_every={self.steps + 1}",
            f"log_every={self.steps}",
        ):
            cmd += ["--set", s]
        started = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=ROOT, env=bench_env(self.threads), capture_output=True, text=True
        )
        self.walls.append(time.perf_counter() - started)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        rel = f"runs/{self.model}/{run_id}/reports/train.json"
        report = json.loads((Path(self.root.removeprefix("file://")) / rel).read_text())
        return float(report["samples_per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4096, help="generated training rows")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()

    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        root = f"file://{Path(tmp).resolve()}"
        generate_data(root, DAY, args.rows)
        for model in args.models.split(","):
            variants = {
                label: Variant(root, model, procs, threads, args.steps)
                for label, procs, threads in VARIANTS
            }
            print(f"benchmarking {model} ...", flush=True)
            rates = interleaved(variants, args.rounds)
            results[model] = {
                label: {
                    "rates": [round(r, 1) for r in rates[label]],
                    "median": median(rates[label]),
                    "wall": median(v.walls),
                    "batch": v.per_rank_batch * v.procs,
                }
                for label, v in variants.items()
            }

    rows = []
    for model, r in results.items():
        base = r[VARIANTS[0][0]]["median"]
        for label, x in r.items():
            rows.append(
                [
                    model,
                    label,
                    x["batch"],
                    f"{x['median']:.1f}",
                    f"{x['median'] / base:.2f}x",
                    f"{x['wall']:.1f}",
                    str(x["rates"]),
                ]
            )
    bullets = [
        f"Command: `{command_line()}`",
        f"Machine: {machine()}",
        f"Date: {dt.datetime.now(dt.UTC).isoformat(timespec='minutes')}; {NOISY}",
        f"Each run: the real `python -m embedfresh.jobs.train` (max_steps {args.steps}, no checkpoint, "
        "no evaluation), samples/s from its train report (first step included); 2 "
        "processes through `torchrun --nproc-per-node 2` (gloo, DDP); variants interleaved, "
        f"{args.rounds} rounds, medians",
        "Fair comparison on 2 cores: `1 x 2 threads` vs `2 x 1 thread`, same global batch; "
        "scaling: `2 x 1 thread` over `1 x 1 thread` (ideal 2.00x)",
        f"Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s",
    ]
    headers = [
        "config",
        "processes x threads",
        "global batch",
        "samples/s (median)",
        "vs 1 x 1",
        "job wall s (median)",
        "samples/s per round",
    ]
    publish(
        section("Data parallel on CPU: 1 vs 2 processes", bullets, [table(headers, rows, 2)]),
        None if args.no_append else BENCHMARKS,
    )


if __name__ == "__main__":
    main()
