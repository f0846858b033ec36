"""What a 10M, 100M and 1B-row corpus becomes as embeddings: the figures of docs/SCALING.md.

Computed, not measured: every input is a constant below with its source (a figure
measured on this box in docs/BENCHMARKS.md, a published benchmark, a price in
:mod:`embedfresh.core.cost`, a documented limit). ``tests/test_embed_array.py`` checks
that the section of docs/SCALING.md between the ``scaling-figures`` markers is exactly
what this prints, so the page cannot drift from the model::

    .venv/bin/python bench/scaling.py            # print the Markdown
    .venv/bin/python bench/scaling.py --write    # rewrite the section in docs/SCALING.md
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from embedfresh.core.cost import PRICES_USD
from embedfresh.core.embed_plan import MAX_CHILDREN, slice_count

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "SCALING.md"
BEGIN, END = "<!-- scaling-figures:begin -->", "<!-- scaling-figures:end -->"

CORPORA = (10_000_000, 100_000_000, 1_000_000_000)
SHARD_ROWS = 10_000
"""Rows a corpus shard (issue 16's 100M-row corpus: 10,000 shards)."""
MAX_SHARDS = 100_000
"""``part-NNNNN.parquet``: five digits, so at most 100,000 shards a corpus."""
MAX_CHILDREN_DEFAULT = 1_000
"""``BatchArrayEmbeddingOperator``'s default ``max_children``."""
MAX_MAP_LENGTH = 1_024
"""Airflow's ``[core] max_map_length`` default."""
TASK_START_S = 3.7
"""Seconds an Airflow task start costs, averaged here (issue 16)."""
CHILD_START_S = 60.0
"""Assumed, not measured: seconds from a child's RUNNABLE to its first batch on a warm
compute environment (container start with the image cached, interpreter and torch import,
model load). A cold environment adds instance launch (minutes)."""
DIM = 384
"""minilm's embedding width: a part is ``rows x (384 x 4 + 8)`` bytes before zstd."""

# S3, per prefix (Amazon S3 user guide, "Best practices design patterns: optimizing
# Amazon S3 performance"), and request prices (S3 Standard, us-east-1, aws.amazon.com/s3/pricing).
S3_PUT_PER_S = 3_500
S3_GET_PER_S = 5_500
S3_PUT_USD_PER_1K = 0.005
S3_GET_USD_PER_1K = 0.0004

# Requests, counted from the code (embedfresh/jobs/embed.py, embed_verify.py, core/markers.py):
PLAN_GET_PER_SHARD = 3  # corpus shard HEAD for its ETag and size (2), marker GET (1)
CHILD_CORPUS_GET_PER_SHARD = 3  # corpus HEAD x2 (reuse key), corpus GET (the shard)
CHILD_OUT_GET_PER_SHARD = 1  # marker GET under embeddings/
CHILD_PUT_PER_SHARD = 2  # part, then its COMMIT marker
CHILD_PUT_FIXED = 5  # lease acquire + release, report, result record, stale-manifest delete
CHILD_GET_FIXED = 2  # the plan, the lease's read
VERIFY_GET_PER_SHARD = 3  # marker, part, corpus shard


@dataclass(frozen=True)
class Device:
    name: str
    rows_per_s: float
    usd_per_hour: float
    source: str


def devices() -> list[Device]:
    """The per-device rates the figures use, each with where it comes from."""
    return [
        Device(
            "cpu (m7i.2xlarge, 8 vCPU)",
            318.7 * 8 / 2,
            PRICES_USD["cpu"],
            "measured here: minilm fp32, packed, 318.7 sentences/s on 2 cores "
            "(BENCHMARKS.md, 2026-11-22), times 4 for 8 vCPUs (assumes linear scaling "
            "across cores); price: cost.py's `cpu`",
        ),
        Device(
            "trn1.2xlarge (1 Trainium chip)",
            3_421.6,
            PRICES_USD["trn1.32xlarge"] / 16,
            "published: bert-base-uncased, sequence 128, batch 16, Neuron 2.27 "
            "(aws-neuron-sdk, about-neuron/benchmarks/trn1/throughput_data_encoder.csv); "
            "price: cost.py's trn1.32xlarge / 16 chips",
        ),
        Device(
            "inf2.xlarge (1 Inferentia2 chip)",
            2_674.2,
            0.758,
            "published: bert-base-uncased, sequence 128, batch 8, Neuron 2.27 "
            "(aws-neuron-sdk, about-neuron/benchmarks/inf2/throughput_data_encoder.csv); "
            "price: Neuron's inf2_instance_prices.csv (not in cost.py)",
        ),
    ]


@dataclass(frozen=True)
class Corpus:
    rows: int
    shards: int
    children: int
    shards_per_child: int
    mapped_tasks: int
    mapped_shards_per_task: int
    output_gb: float
    plan_requests: int
    child_get: int
    child_put: int
    verify_get: int

    @property
    def requests(self) -> int:
        return self.plan_requests + self.child_get + self.child_put + self.verify_get

    @property
    def request_usd(self) -> float:
        gets = self.plan_requests + self.child_get + self.verify_get
        return gets / 1000 * S3_GET_USD_PER_1K + self.child_put / 1000 * S3_PUT_USD_PER_1K


def corpus(rows: int, max_children: int = MAX_CHILDREN_DEFAULT) -> Corpus:
    shards = math.ceil(rows / SHARD_ROWS)
    if shards > MAX_SHARDS:
        raise ValueError(f"{shards} shards: a corpus holds at most {MAX_SHARDS}")
    children = slice_count(shards, max_children)
    per_task = math.ceil(shards / MAX_MAP_LENGTH)
    lists = math.ceil(shards / 1000)  # ListObjectsV2 pages of 1,000 keys
    return Corpus(
        rows=rows,
        shards=shards,
        children=children,
        shards_per_child=math.ceil(shards / children),
        mapped_tasks=math.ceil(shards / per_task),
        mapped_shards_per_task=per_task,
        output_gb=rows * (DIM * 4 + 8) / 1e9,
        plan_requests=lists + PLAN_GET_PER_SHARD * shards,
        child_get=(CHILD_CORPUS_GET_PER_SHARD + CHILD_OUT_GET_PER_SHARD) * shards
        + CHILD_GET_FIXED * children,
        child_put=CHILD_PUT_PER_SHARD * shards + CHILD_PUT_FIXED * children,
        verify_get=lists + VERIFY_GET_PER_SHARD * shards,
    )


def shard_seconds(device: Device) -> float:
    return SHARD_ROWS / device.rows_per_s


def max_concurrent(device: Device) -> int:
    """Devices embedding at once before one prefix meets S3's per-prefix rate: the
    corpus prefix's GETs (3 a shard) bind first, then the output prefix's PUTs (2)."""
    t = shard_seconds(device)
    return int(
        min(
            S3_GET_PER_S * t / CHILD_CORPUS_GET_PER_SHARD,
            S3_PUT_PER_S * t / CHILD_PUT_PER_SHARD,
            S3_GET_PER_S * t / CHILD_OUT_GET_PER_SHARD,
        )
    )


def lean_children(c: Corpus, d: Device) -> int:
    """``max_children`` that keeps starts at most 10% of the device-hours: each child
    embeds at least 9 starts' worth of shards."""
    per_child = max(1, math.ceil(9 * CHILD_START_S / shard_seconds(d)))
    return max(1, min(c.children, c.shards // per_child))


def lean_wall(c: Corpus, d: Device) -> float:
    children = lean_children(c, d)
    return CHILD_START_S + math.ceil(c.shards / children) * shard_seconds(d)


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _h(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def markdown() -> str:
    rows = [corpus(r) for r in CORPORA]
    devs = devices()
    out = [
        f"Shards of {_n(SHARD_ROWS)} rows; `max_children` {_n(MAX_CHILDREN_DEFAULT)} (the "
        f"operator's default, Batch allows {_n(MAX_CHILDREN)}); minilm's {DIM}-wide fp32 vectors.",
        "",
        "| corpus rows | shards | array children | shards a child | output (GB, before zstd) "
        "| mapped tasks instead (shards a task, at max_map_length 1,024) "
        "| worker time in their task starts |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    for c in rows:
        out.append(
            f"| {_n(c.rows)} | {_n(c.shards)} | {_n(c.children)} | {_n(c.shards_per_child)} "
            f"| {c.output_gb:,.1f} | {_n(c.mapped_tasks)} ({c.mapped_shards_per_task}) "
            f"| {_h(c.mapped_tasks * TASK_START_S)} |"
        )
    out += [
        "",
        "Time and cost per device kind, each child on its own device: device-hours are "
        f"the bill (embedding plus {CHILD_START_S:.0f} s of start a child, an assumption: "
        "see below), wall time is one child's (start plus its shards), all children at once.",
        "",
        "| device | rows/s | s a shard | corpus rows | device-hours | of which starts "
        "| cost (USD) | wall, children at once | children for starts <= 10% (wall) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d in devs:
        t = shard_seconds(d)
        for c in rows:
            starts = c.children * CHILD_START_S / 3600
            hours = c.rows / d.rows_per_s / 3600 + starts
            out.append(
                f"| {d.name} | {_n(d.rows_per_s)} | {t:.2f} | {_n(c.rows)} | {hours:,.1f} "
                f"| {starts / hours:.0%} | {hours * d.usd_per_hour:,.2f} "
                f"| {_h(CHILD_START_S + c.shards_per_child * t)} "
                f"| {_n(lean_children(c, d))} ({_h(lean_wall(c, d))}) |"
            )
    out += ["", "Where each rate and price comes from:", ""]
    out += [f"- {d.name}: {d.source}." for d in devs]
    out += [
        "",
        "S3 requests of one run over a fresh corpus (planner + children + verify), counted "
        "from the code, and their price (S3 Standard, us-east-1: "
        f"${S3_PUT_USD_PER_1K} per 1,000 PUT, ${S3_GET_USD_PER_1K} per 1,000 GET):",
        "",
        "| corpus rows | planner GET/HEAD/LIST | children GET/HEAD | children PUT | verify GET/LIST | total | request cost (USD) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in rows:
        out.append(
            f"| {_n(c.rows)} | {_n(c.plan_requests)} | {_n(c.child_get)} | {_n(c.child_put)} "
            f"| {_n(c.verify_get)} | {_n(c.requests)} | {c.request_usd:,.2f} |"
        )
    out += [
        "",
        f"Per-prefix rate: each embedding device asks the corpus prefix for "
        f"{CHILD_CORPUS_GET_PER_SHARD} GET/HEAD and the output prefix for "
        f"{CHILD_PUT_PER_SHARD} PUT and {CHILD_OUT_GET_PER_SHARD} GET a shard. Devices at "
        f"once before a prefix reaches S3's {_n(S3_GET_PER_S)} GET/s or {_n(S3_PUT_PER_S)} PUT/s:",
        "",
        "| device | s a shard | devices at once before the per-prefix limit | children at once with max_children 1,000 |",
        "|---|---:|---:|---:|",
    ]
    for d in devs:
        m = max_concurrent(d)
        out.append(
            f"| {d.name} | {shard_seconds(d):.2f} | {_n(m)} | "
            f"{_n(MAX_CHILDREN_DEFAULT)} ({'under' if MAX_CHILDREN_DEFAULT <= m else 'OVER'}) |"
        )
    return "\n".join(out) + "\n"


def section(text: str) -> str:
    """The figures section of a SCALING.md text (between the markers)."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, re.S)
    if match is None:
        raise ValueError(f"{DOC} has no {BEGIN} ... {END} section")
    return match.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/SCALING.md's section")
    args = parser.parse_args(argv)
    figures = markdown()
    if args.write:
        text = DOC.read_text()
        old = section(text)
        DOC.write_text(text.replace(f"{BEGIN}\n{old}{END}", f"{BEGIN}\n{figures}{END}"))
    print(figures, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
