"""Landing-to-searchable through Airflow: a change set lands in the corpus of a live
release, the ``corpus_sync`` DAG runs, and the new documents are found through the live
view; how long that takes, and where the time goes.

Run on demand after ``make demo`` (its store and its Airflow home), not in CI::

    OMP_NUM_THREADS=2 .venv/bin/python bench/corpus_landing.py [--root artifacts/demo] [--add 1000] [--change 500] [--delete 300]

The demo store is copied to a scratch folder and its index re-attached there
(``index_attach``, the documented command after a store moved), so the demo is left as
it was. One change set adds ``--add`` documents, changes ``--change`` and deletes
``--delete`` (texts drawn from the corpus's own words). Then ``dag.test()`` of
``corpus_sync`` runs with the copy as its artifact root: Airflow parses the DAG, runs the
task, whose job embeds the upserts with the release's own encoder and applies them in
one transaction. The clock stops when the run ends, and the bench then checks that every
added id is in the live table and no deleted one is: the landing-to-searchable latency,
at most (the scheduler's reaction to the Asset event, a second or two, comes on top). A
second change set of the same size then goes through
the job alone (the CLI), so the table shows Airflow's share. Prints a Markdown section
and appends it to ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import command_line, machine, publish, section, table

ROOT = Path(__file__).resolve().parents[1]
MODEL, CORPUS = "tiny", "products"  # the demo's

DAG_TEST = r"""
import json, sys, time
t0 = time.perf_counter()
from airflow.dag_processing.dagbag import DagBag

dag = DagBag(sys.argv[1]).get_dag("corpus_sync")
t1 = time.perf_counter()
run = dag.test(run_conf={"artifact_root": sys.argv[2]})
print("BENCH " + json.dumps({"state": str(run.state), "parse": t1 - t0, "run": time.perf_counter() - t1}))
"""


def snapshot(store) -> tuple[np.ndarray, list[str]]:
    """The corpus snapshot's ids, and the words of its first texts."""
    from embedfresh.core import layout
    from embedfresh.core.shards import corpus_shards, read_corpus_shard

    ids, texts = [], []
    for part in corpus_shards(store, CORPUS).values():
        i, t = read_corpus_shard(store, f"{layout.corpus(CORPUS)}/{part}")
        ids += i.tolist()
        texts += list(t)
    return np.asarray(ids, dtype=np.int64), " ".join(texts[:5000]).split()


def change_set(store, rng, ids_now, words, add: int, change: int, delete: int, tag: str):
    """Land one change set on the corpus whose ids are ``ids_now``; the ids it adds and
    deletes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedfresh.core import layout

    def text() -> str:
        return " ".join(rng.choice(words, size=int(rng.integers(8, 60)))) + f" {tag}"

    added = np.arange(ids_now.max() + 1, ids_now.max() + 1 + add)
    picked = rng.choice(ids_now, change + delete, replace=False)
    changed, deleted = picked[:change], picked[change:]
    data = pa.table(
        {
            "op": ["upsert"] * (add + change) + ["delete"] * delete,
            "id": pa.array(np.concatenate([added, changed, deleted]), pa.int64()),
            "text": [text() for _ in range(add + change)] + [None] * delete,
        }
    )
    out = pa.BufferOutputStream()
    pq.write_table(data, out)
    store.write_bytes(layout.change_set(CORPUS, tag), out.getvalue().to_pybytes())
    return added, deleted


def searchable(root: str, added: np.ndarray, deleted: np.ndarray) -> dict | None:
    """The live release's sync record when every added id is in its table and no
    deleted one is; else None."""
    from embedfresh.core import layout
    from embedfresh.core.index import open_index
    from embedfresh.core.releases import live_release
    from embedfresh.core.storage import ArtifactStore

    store = ArtifactStore(root)
    release = live_release(store, MODEL)
    with open_index(root) as index:
        table = release.corpus(CORPUS).table
        if len(index.missing_ids(table, added)) or len(index.missing_ids(table, deleted)) < len(
            deleted
        ):
            return None
    return store.read_json(layout.sync_record(MODEL, release.release, CORPUS))


def timed(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, dict]:
    """The command's seconds, and what it printed after ``BENCH``."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    log.open("a").write(done.stdout + done.stderr)
    if done.returncode:
        sys.exit(f"{' '.join(cmd[:4])} ... exited {done.returncode}; see {log}")
    said = [line[6:] for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    return seconds, json.loads(said[-1]) if said else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=str(ROOT / "artifacts" / "demo"))
    parser.add_argument("--airflow-home", default=str(ROOT / "airflow-home"))
    parser.add_argument("--add", type=int, default=1000)
    parser.add_argument("--change", type=int, default=500)
    parser.add_argument("--delete", type=int, default=300)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    from embedfresh.core.storage import ArtifactStore

    if not (Path(args.airflow_home) / "airflow.db").exists():
        sys.exit(f"no Airflow home at {args.airflow_home}: run `make demo` first")
    work = Path(tempfile.mkdtemp(prefix="bench-landing-"))
    copy = work / "store"
    shutil.copytree(args.root, copy)
    root = f"file://{copy}"
    log = work / "bench.log"
    env = {**os.environ, "AIRFLOW_HOME": args.airflow_home, "HF_HUB_OFFLINE": "1",
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "EMBEDFRESH_ARTIFACT_ROOT": root,
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{args.airflow_home}/airflow.db",
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins")}  # fmt: skip
    env.pop("EMBEDFRESH_INDEX_DSN", None)
    job = [sys.executable, "-m", "embedfresh.jobs.{}", "--set", f"artifact_root={root}"]
    attach = [job[0], job[1], job[2].format("index_attach"), *job[3:]]
    timed(attach, env, log)  # the copy's index, where the copy is
    store = ArtifactStore(root)
    rng = np.random.default_rng(0)
    ids_now, words = snapshot(store)
    rows = []
    for n, how in enumerate(("dag", "job")):
        # Named as a producer names them (a UTC time): after every change set there.
        tag = dt.datetime.now(dt.UTC).strftime(f"%Y-%m-%dT%H-%M-%S-{n}Z")
        added, deleted = change_set(store, rng, ids_now, words, args.add, args.change,
                                    args.delete, tag)  # fmt: skip
        ids_now = np.union1d(np.setdiff1d(ids_now, deleted), added)
        if how == "dag":
            cmd = [sys.executable, "-c", DAG_TEST, str(ROOT / "dags"), root]
        else:
            cmd = [job[0], job[1], job[2].format("corpus_sync"), *job[3:]]
        seconds, said = timed(cmd, env, log)
        if (record := searchable(root, added, deleted)) is None:
            sys.exit(f"after the {how} the live table lacks an added id or holds a deleted one")
        if record["rows"] != len(ids_now):
            sys.exit(f"the table holds {record['rows']} rows, the corpus {len(ids_now)}")
        if how == "dag":
            rows.append(["corpus_sync DAG: dag.test(), the DAG folder parsed first",
                         f"{seconds:.1f}"])  # fmt: skip
            rows.append(["... of which parsing the DAG folder", f"{said['parse']:.1f}"])
            rows.append(["... of which the run (its task starts the job)", f"{said['run']:.1f}"])
        else:
            rows.append(["corpus_sync job alone (CLI)", f"{seconds:.1f}"])
    shutil.rmtree(work)
    bullets = [
        f"command: `{command_line(int(os.environ.get('OMP_NUM_THREADS', '2')))}`",
        f"machine: {machine()}; one run; load average (1, 5, 15 min) at the end "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        f"store: a copy of `make demo`'s (model tiny, corpus {CORPUS}, "
        f"{record.get('rows', '?'):,} rows after); each change set: {args.add:,} added, "
        f"{args.change:,} changed, {args.delete:,} deleted documents",
    ]
    text = section(
        "Corpus sync: landing to searchable",
        bullets,
        [table(["path (the change set landed, then)", "seconds to searchable"], rows)],
    )
    print(text)
    if not args.no_append:
        publish(text)


if __name__ == "__main__":
    main()
