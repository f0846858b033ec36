"""The corpus sync's database side on this box: how fast a change set is applied to a
release's table with its HNSW index kept (against the same table without one: what the
graph's upkeep costs), and query latency while a change set is being applied.

Run on demand, not in CI (about 5 minutes on 2 cores at 100,000 rows)::

    OMP_NUM_THREADS=2 .venv/bin/python bench/corpus_sync.py [--rows 100000] [--upserts 10000] [--deletes 2000] [--maintenance-work-mem 1GB]

A table of ``--rows`` random unit vectors (384 dimensions, int64 ids) is loaded through
the index's own ``load_shard`` and indexed (HNSW m 16, ef_construction 200, the load
job's defaults); then one change set of ``--upserts`` upserts (half new ids, half
replacing rows) and ``--deletes`` deletes goes through
:meth:`~embedfresh.core.index.pgvector.PgVectorIndex.apply_changes`, the corpus sync's
one transaction. The same change set is applied to a second, unindexed copy. While the
indexed apply runs, a second connection searches (k 10, ef_search 100) one query at a
time; its latency is compared with the same queries before. Embedding the upserted
texts is the encoder's cost, measured in bench/embeddings.py. Prints a Markdown section
and appends it to ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import numpy as np
from _common import command_line, machine, publish, section, table

DIM = 384


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def loaded(index, name: str, rows: int, ann: bool, memory: str) -> float:
    """A catalogued table of ``rows`` random vectors; the HNSW build's seconds."""
    from embedfresh.core.index import AnnSettings, TableSpec

    spec = TableSpec(name=name, model="bench", release=name, corpus="synthetic", version="v1",
                     dim=DIM, id_type="int64", manifest_sha256="bench", rows=rows)  # fmt: skip
    index.prepare_table(spec)
    rng = np.random.default_rng(0)
    for start in range(0, rows, 50_000):
        n = min(50_000, rows - start)
        index.load_shard(name, f"part-{start}", "bench", np.arange(start, start + n), unit(rng, n))
    t0 = time.perf_counter()
    if ann:
        index.build_ann(name, AnnSettings(16, 200, 100, memory))
    return time.perf_counter() - t0


def change(rows: int, upserts: int, deletes: int):
    rng = np.random.default_rng(1)
    replaced = rng.choice(rows, upserts // 2, replace=False)
    added = np.arange(rows, rows + upserts - len(replaced))
    rest = np.setdiff1d(np.arange(rows), replaced)
    deleted = rng.choice(rest, deletes, replace=False)
    return np.concatenate([replaced, added]), unit(rng, upserts), deleted


def searches(
    dsn: str,
    name: str,
    queries: np.ndarray,
    stop: threading.Event | None,
    connected: threading.Event | None = None,
) -> list:
    """Latencies (ms) of ``queries``, one at a time on a connection of its own; with
    ``stop``, round after round until it is set. ``connected`` is set once the connection
    is open, so the apply starts after it (the reader never waits to connect)."""
    from embedfresh.core.index.pgvector import PgVectorIndex

    out: list[float] = []
    with PgVectorIndex(dsn) as index:
        if connected is not None:
            connected.set()
        while True:
            found = index.search(name, queries, 10, ef_search=100)
            out += (found.seconds * 1000).tolist()
            if stop is None or stop.is_set():
                return out


def run(rows: int, upserts: int, deletes: int, memory: str) -> dict:
    from embedfresh.core.index import AppliedChange
    from embedfresh.core.index.embedded import EmbeddedServer
    from embedfresh.core.index.pgvector import PgVectorIndex

    out: dict = {"rows": rows, "upserts": upserts, "deletes": deletes}
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        server = EmbeddedServer(f"{tmp}/pg")
        dsn = server.start()
        try:
            queries = unit(np.random.default_rng(2), 200)
            ids, vectors, gone = change(rows, upserts, deletes)
            done = AppliedChange("c1", "bench", upserts, deletes)
            with PgVectorIndex(dsn) as index:
                out["build_seconds"] = loaded(index, "indexed", rows, True, memory)
                loaded(index, "plain", rows, False, memory)
                out["idle_ms"] = searches(dsn, "indexed", queries, None)
                stop = threading.Event()
                busy: list[float] = []
                connected = threading.Event()
                reader = threading.Thread(
                    target=lambda: busy.extend(searches(dsn, "indexed", queries, stop, connected))
                )
                reader.start()
                connected.wait()
                t0 = time.perf_counter()
                index.apply_changes("indexed", done, ids, vectors, gone)
                out["indexed_seconds"] = time.perf_counter() - t0
                stop.set()
                reader.join()
                out["during_ms"] = busy
                t0 = time.perf_counter()
                index.apply_changes("plain", done, ids, vectors, gone)
                out["plain_seconds"] = time.perf_counter() - t0
                out["rows_after"] = index.count("indexed")
        finally:
            server.release()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--upserts", type=int, default=10_000)
    parser.add_argument("--deletes", type=int, default=2_000)
    parser.add_argument(
        "--maintenance-work-mem",
        default="1GB",
        help="the HNSW build's memory: the graph must fit (about 2 kB a row at 384-d, m 16)",
    )
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    host = machine()
    r = run(args.rows, args.upserts, args.deletes, args.maintenance_work_mem)
    ops = r["upserts"] + r["deletes"]

    def pct(ms: list[float]) -> str:
        return f"{np.percentile(ms, 50):.2f} / {np.percentile(ms, 99):.2f}"

    rows = [
        ["HNSW kept (what the sync does)", f"{r['indexed_seconds']:.1f}",
         f"{ops / r['indexed_seconds']:,.0f}"],
        ["no index (the graph's upkeep left out)", f"{r['plain_seconds']:.1f}",
         f"{ops / r['plain_seconds']:,.0f}"],
    ]  # fmt: skip
    bullets = [
        f"command: `{command_line(threads)}`",
        f"machine: {host}; one run; load average (1, 5, 15 min) at the end "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        f"table: {r['rows']:,} random unit vectors (384-d), HNSW built in "
        f"{r['build_seconds']:.0f} s (maintenance_work_mem {args.maintenance_work_mem}); change set: {r['upserts']:,} upserts (half new ids) and "
        f"{r['deletes']:,} deletes in one transaction; {r['rows_after']:,} rows after",
        f"query latency p50 / p99 ms (k 10, ef_search 100, one connection): idle "
        f"{pct(r['idle_ms'])}, while the change set is applied {pct(r['during_ms'])} "
        f"({len(r['during_ms'])} queries)",
    ]
    text = section(
        "Corpus sync: applying a change set to a live table",
        bullets,
        [table(["apply", "seconds", "operations/s"], rows)],
    )
    print(text)
    if not args.no_append:
        publish(text)


if __name__ == "__main__":
    main()
