"""The fault-point matrix: every write of every job, killed right after it, then re-run.

A clean run of each job records the writes its store makes (``EMBEDFRESH_WRITES_LOG``,
:mod:`embedfresh.core.storage.faults`): that list is the job's fault points, so a write
added to a job joins the matrix by itself. For each point the job starts again from the
state before it with ``EMBEDFRESH_FAULT_POINT`` naming the point and is SIGKILLed right
after that write; then the same command runs again, plainly. It must finish with the
clean run's exit code and leave the store exactly as the clean run did: the same files,
byte-identical (JSON reports compared without their clocks), nothing staged left over.

The jobs run in the order of a refresh, each on the state the previous one left, all in
one store path (reports hold absolute URLs): train (from production, a checkpoint
between two steps), evaluate, gate, embed the candidate, verify, load the index, search
check, release, the corpus sync of a change set landed meanwhile, export, compile
(eager), rollback and garbage collection.

The vector index is part of the state: a database of its own on the session's PostgreSQL
(:mod:`tests.reliability.index_state`), snapshotted before each job and restored with
the store before each point. Its statements are fault points too (``db``: a shard's
rows with its ledger row, the HNSW build, a live view's switch, a table dropped), and
the state compared holds the catalogue, the ledger, the live views and every table's
rows. docs/RELIABILITY.md lists the points and the figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from embedfresh.core.settings import INDEX_DSN_ENV
from embedfresh.core.storage.faults import FAULT_POINT, WRITES_LOG
from embedfresh.core.storage.local import STAGING
from tests.conftest import run_job
from tests.releasing import release_run
from tests.reliability import figures
from tests.reliability.forked import Finished, ForkServer
from tests.reliability.index_state import IndexSnapshots

#: The refresh, in order: (job, its --set values after artifact_root, its clean exit code).
CHAIN = [
    (
        "train",
        [
            "run_id=r2",
            "data_interval_start=2026-01-02",
            "max_steps=6",
            "checkpoint_every=4",
            "keep_last=1",
        ],
        0,
    ),
    ("evaluate", ["run_id=r2"], 0),
    # A wide tolerance makes the small eval set's verdict PASS, so promote has work to do.
    ("gate", ["run_id=r2", "tolerance=0.5", "resamples=200"], 0),
    # The candidate, made ready to serve before it goes live.
    ("embed", ["run_id=r2", "version=r2"], 0),
    ("embed_verify", ["run_id=r2", "version=r2"], 0),
    ("index_load", ["run_id=r2"], 0),
    ("search_check", ["run_id=r2"], 0),
    ("release", ["run_id=r2"], 0),
    # The change set landed after r1 reaches r2's table.
    ("corpus_sync", ["run_id=s2"], 0),
    ("export_st", ["run_id=r2", "version=r2"], 0),
    ("compile", ["run_id=c1", "compile=off"], 0),
    # A person takes production back to release r1, with its table.
    ("rollback", ["run_id=back", "to_release=r1", "reason=fault-point matrix", "who=ci"], 0),
    # Retention 1, no grace: r2's table, embeddings and version go.
    ("garbage_collect", ["run_id=gc", "keep_releases=1", "grace_hours=0"], 0),
    # A team's BEIR folder (LANDING, written inside the store at landing/nf): its
    # collection in two parts, then its judgments.
    (
        "import_labels",
        [
            "run_id=imp",
            "source={root}/landing/nf",
            "shape=beir",
            "dataset=nf",
            "corpus=nf",
            "corpus_shard_rows=2",
        ],
        0,
    ),  # fmt: skip
]
JOBS = [job for job, _, _ in CHAIN]
#: The BEIR folder ``import_labels`` reads (``{root}`` in a chain entry is the store's URL).
LANDING = {
    "corpus.jsonl": '{"_id": "MED-10", "title": "Statins", "text": "Statin use."}\n'
    '{"_id": "МЕД-2", "text": "Витамин D."}\n{"_id": "医-3", "title": "食事", "text": "野菜。"}\n',
    "queries.jsonl": '{"_id": "PLAIN-2", "text": "statins"}\n{"_id": "PLAIN-12", "text": "витамин"}\n',
    "qrels/test.tsv": "query-id\tcorpus-id\tscore\nPLAIN-2\tMED-10\t2\nPLAIN-2\t医-3\t0\n"
    "PLAIN-12\tМЕД-2\t1\n",
}


def chain_sets(sets: list[str], root: str) -> list[str]:
    """A chain entry's settings at the store ``root``."""
    return [s.replace("{root}", root) for s in sets]


#: JSON keys whose values are clocks or speeds: equal runs differ in them.
CLOCKS = (
    "seconds",
    "_at",
    "per_second",
    "per_s",
    "hours",
    "cost_usd",
    "started",
    "finished",
    "duration",
    "latency",
    "rss",
    "attempt_id",
    "pid",
    "host",
)
#: Keys that tell which attempt did the work: a resumed run rightly says it resumed.
ATTEMPT = {
    "resumed_from",
    "steps_this_attempt",
    "already",
    "verified",
    "skipped",
    "batches",
    "reused",
    "shards_reused",
    "shards_computed",
    # The index load's, release's and garbage collection's own work this attempt: the
    # state (the store and the index) says what is done.
    "parts_loaded",
    "parts_reused",
    "rows_loaded",
    "ann_built",
    "live_views_switched",
    "tables_dropped",
    "applied_now",
    "upserts_now",
    "deletes_now",
    "truncated_now",
    "view_repaired",
    "change_sets_applied_now",
    "embeddings_deleted",
    "versions_deleted",
}


#: The embed job reports what *this attempt* embedded (a re-run embeds only the shards
#: not yet committed): its counters differ by design; which shards are committed must not,
#: nor the rows and truncated texts of the whole output (embedded plus reused).
EMBED_ATTEMPT = {
    "truncated_per_shard",
    "real_tokens",
    "padded_tokens",
    "padding_efficiency",
    "shapes",
    "compiles",
    "shards_recomputed",
}


def _embed_report(doc: dict) -> dict:
    doc = {k: v for k, v in doc.items() if k not in EMBED_ATTEMPT}
    doc["rows_in_output"] = doc.pop("rows", 0) + doc.pop("rows_reused", 0)
    doc["truncated_in_output"] = doc.pop("truncated", 0) + doc.pop("truncated_reused", 0)
    doc["shards_committed"] = sorted(doc.pop("shards_done", []) + doc.pop("shards_skipped", []))
    return doc


def _volatile(key: str) -> bool:
    return key in ATTEMPT or any(part in key for part in CLOCKS)


def _stable(obj):
    if isinstance(obj, dict):
        return {k: _stable(v) for k, v in obj.items() if not _volatile(k)}
    if isinstance(obj, list):
        return [_stable(v) for v in obj]
    return obj


def normalised(rel: str, data: bytes) -> str:
    """One object as the matrix compares it: its sha256, or for JSON and markers its
    content without clocks (and, for the embed report, without this attempt's counters)."""
    path = PurePosixPath(rel)
    if path.suffix == ".json" or path.name.endswith("COMMIT"):
        doc = json.loads(data)
        if path.name == "embed.json" or path.name.startswith("embed-"):
            if "summary" in doc:  # the result record (results/embed.json)
                doc["summary"] = _embed_report(doc["summary"])
            else:  # the report (reports/embed-<corpus>.json)
                doc = _embed_report(doc)
        return json.dumps(_stable(doc), sort_keys=True)
    return hashlib.sha256(data).hexdigest()


def is_leftover(rel: PurePosixPath) -> bool:
    """What no finished run may leave: a staged write, a temporary, a probe, a lease.
    (The compare-and-swap lock files under ``.staging/locks`` stay by design.)"""
    return (
        rel.name.endswith(".tmp")
        or rel.name == ".write-probe"
        or rel.parent.name == "leases"
        or (rel.parts[0] == STAGING and rel.parts[1:2] != ("locks",))
    )


def state(root: Path) -> dict[str, str]:
    """Every file of the store as :func:`normalised` (the store's scratch folder,
    ``.staging``, left out: :func:`leftovers` checks it)."""
    return {
        str(path.relative_to(root)): normalised(str(path.relative_to(root)), path.read_bytes())
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.relative_to(root).parts[0] != STAGING
    }


def _first_difference(got: str | None, expected: str | None) -> str:
    """Where two :func:`state` values first differ: a JSON key path, or the values."""

    def walk(a, b, path: str) -> str | None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if (found := walk(a.get(k), b.get(k), f"{path}.{k}")) is not None:
                    return found
            return None
        if a != b:
            return f"{path}: {str(a)[:200]} != {str(b)[:200]}"
        return None

    try:
        return walk(json.loads(got or "null"), json.loads(expected or "null"), "") or "?"
    except json.JSONDecodeError:
        return f"{got} != {expected}"


def leftovers(root: Path) -> list[str]:
    return sorted(
        str(rel)
        for rel in (PurePosixPath(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        if is_leftover(rel)
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ForkServer:
    return ForkServer(tmp_path_factory.mktemp("fork-output"))


@pytest.fixture(scope="module")
def index(pg_server: str) -> IndexSnapshots:
    """The matrix's vector index: a database of the session's server, and its snapshots."""
    return IndexSnapshots(pg_server, "fault_points")


def first_release(root: str, index: IndexSnapshots) -> None:
    """Production before the chain: release ``r1`` of version ``r1`` (trained from the
    base weights) with the products corpus, in the index; a real interpreter trains it
    (the forked runner must match it), the release's jobs run in this process."""
    first = run_job(
        "train", f"artifact_root={root}", "run_id=r1", "data_interval_start=2026-01-01",
        "max_steps=2", "init=base",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INDEX_DSN_ENV, index.dsn)
        release_run(root, "r1", regression="report")
        land_change_set(root)
        # Its landing's sync (the corpus_sync DAG's): r1's table is the corpus at the
        # watermark r2's load catches up to, so the search check compares like with like.
        from embedfresh.core.config import CorpusSyncConfig
        from embedfresh.jobs.corpus_sync import corpus_sync

        corpus_sync(CorpusSyncConfig(artifact_root=root, run_id="s1", corpus="products"))


def land_change_set(root: str) -> None:
    """A change set for the chain's corpus sync: two documents added (in three
    scripts), the corpus's first document changed and its second deleted."""
    import pyarrow as pa

    from embedfresh.core import layout
    from embedfresh.core.shards import corpus_shards, read_corpus_shard
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.generate import parquet_bytes

    store = ArtifactStore(root)
    first = next(iter(corpus_shards(store, "products").values()))
    ids, _ = read_corpus_shard(store, f"{layout.corpus('products')}/{first}")
    table = pa.table(
        {
            "op": ["upsert", "upsert", "upsert", "delete"],
            "id": pa.array([10**9, 10**9 + 1, int(ids[0]), int(ids[1])], pa.int64()),
            "text": ["trail shoes, ботинки", "防水 jacket", "a changed title", None],
        }
    )
    store.write_bytes(layout.change_set("products", "0001"), parquet_bytes(table))


@pytest.fixture(scope="module")
def chain(
    data_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
    server: ForkServer,
    index: IndexSnapshots,
) -> tuple[Path, dict[str, Path]]:
    """The store path every run uses, and a snapshot of the store (and of the index,
    labelled by job) before each job.

    Production is release ``r1``; the chain is the next day's refresh, ``r2``, run
    cleanly once, then a rollback to r1 and a garbage collection."""
    base = tmp_path_factory.mktemp("faults")
    store = base / "store"
    shutil.copytree(data_template, store)
    root = f"file://{store}"
    first_release(root, index)
    for name, text in LANDING.items():
        (store / "landing/nf" / name).parent.mkdir(parents=True, exist_ok=True)
        (store / "landing/nf" / name).write_text(text)
    before = {}
    for job, sets, code in CHAIN:
        before[job] = base / f"before-{job}"
        shutil.copytree(store, before[job])
        index.snapshot(job)
        done = server.run(job, f"artifact_root={root}", *chain_sets(sets, root),
                          env={INDEX_DSN_ENV: index.dsn})  # fmt: skip
        assert done.exitcode == code, f"{job}: {done.stderr[-3000:]}"
    return store, before


def _restore(store: Path, snapshot: Path) -> None:
    shutil.rmtree(store)
    shutil.copytree(snapshot, store)


#: Replays a sampled matrix (:class:`Sample`): the seed its run printed. Unset, the seed
#: is the checkout's commit, so the sample rotates with each commit.
SAMPLE_SEED = "EMBEDFRESH_FAULT_SAMPLE_SEED"
#: The seed without the variable and without git (a copy of the tree, not a checkout).
FALLBACK_SEED = "embedfresh-fault-points"


def sample_seed() -> str:
    """:data:`SAMPLE_SEED` when set, else ``git rev-parse HEAD`` of this checkout, else
    :data:`FALLBACK_SEED`."""
    if seed := os.environ.get(SAMPLE_SEED, "").strip():
        return seed
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return FALLBACK_SEED
    return head or FALLBACK_SEED


def point_op(point: str) -> str:
    """The operation of a point (``<n> <op> <path>``, a rank's ``rank<R>: ...``)."""
    return point.rpartition(": ")[2].split(" ", 2)[1]


@dataclass(frozen=True)
class Sample:
    """Which points a matrix kills when it does not kill them all: every point whose
    operation is in ``always``, and ``k`` of the others drawn with ``seed`` (a job's
    draw depends on the seed and the job's label only, so the seed replays it)."""

    always: frozenset[str]
    k: int
    seed: str

    def choose(self, label: str, points: list[str]) -> list[str]:
        """The chosen points, in the order the job writes them."""
        rest = [p for p in points if point_op(p) not in self.always]
        drawn = set(random.Random(f"{self.seed}/{label}").sample(rest, min(self.k, len(rest))))
        return [p for p in points if point_op(p) in self.always or p in drawn]

    def describe(self, label: str, chosen: list[str], points: list[str]) -> str:
        return (
            f"{label}: {len(chosen)} of {len(points)} points killed (every "
            f"{'/'.join(sorted(self.always))}, {self.k} of the rest drawn with "
            f"{SAMPLE_SEED}={self.seed}; set it to replay): " + "; ".join(chosen)
        )


def run_matrix(
    label: str,
    run: Callable[..., Finished],
    args: tuple[str, ...],
    code: int,
    restore: Callable[[], None],
    state: Callable[[], dict[str, str]],
    leftovers: Callable[[], list[str]],
    logs: Path,
    sample: Sample | None = None,
    share: tuple[int, int] = (0, 1),
) -> None:
    """The matrix of one job on one store: a clean run records the points and the state
    to reach; each point is killed, then re-run plainly and compared. ``run(*args,
    env=...)`` starts the job; ``restore()`` puts the store back to before the job.
    ``sample``: kill only the points it chooses (printed, with its seed), else every one.
    ``share``: ``(i, n)`` kills the i-th of every n chosen points, so a long matrix runs
    as n tests (each with its own clean run) that together kill every chosen point."""
    restore()
    log = logs / "clean.log"
    clean = run(*args, env={WRITES_LOG: str(log)})
    assert clean.exitcode == code, clean.stderr[-3000:]
    points = log.read_text().splitlines()
    assert points, f"{label} made no writes"
    expected = state()
    assert not leftovers(), leftovers()

    chosen, chose = points, f"{label}: every one of its {len(points)} points killed"
    if sample is not None:
        chosen = sample.choose(label, points)
        chose = sample.describe(label, chosen, points)
    part, parts = share
    if parts > 1:
        chosen = chosen[part::parts]
        chose += f"; this test kills share {part + 1} of {parts}: " + "; ".join(chosen)
        label = f"{label} share {part + 1}/{parts}"
        assert chosen, f"{label}: no point in this share ({chose})"
    print(chose)

    failures = []
    started = time.perf_counter()
    for point in chosen:
        restore()
        killed_log = logs / "killed.log"
        killed_log.unlink(missing_ok=True)
        killed = run(*args, env={FAULT_POINT: point, WRITES_LOG: str(killed_log)})
        if killed.exitcode != -9 or killed_log.read_text().splitlines()[-1:] != [point]:
            failures.append(f"{point}: not killed there (exit {killed.exitcode}) "
                            f"{killed.stderr[-500:]}")  # fmt: skip
            continue
        again = run(*args, env={})
        if again.exitcode != code:
            failures.append(f"{point}: re-run exit {again.exitcode}: {again.stderr[-800:]}")
            continue
        if left := leftovers():
            failures.append(f"{point}: left {left}")
        got = state()
        if got != expected:
            diff = sorted(
                k for k in set(got) | set(expected) if got.get(k) != expected.get(k)
            )  # fmt: skip
            failures.append(
                f"{point}: store differs from the clean run's in {diff[:6]}; "
                f"{diff[0]}: {_first_difference(got.get(diff[0]), expected.get(diff[0]))}"
            )
    seed = {} if sample is None else {"of": len(points), "seed": sample.seed}
    figures.record(
        "fault_points",
        job=label,
        **{"points": len(chosen), "failed": len(failures),
         "seconds": round(time.perf_counter() - started, 1), "names": chosen, **seed},
    )  # fmt: skip
    assert not failures, (
        f"{len(failures)} of {len(chosen)} points:\n" + "\n".join(failures) + f"\n({chose})"
    )


@pytest.mark.slow
@pytest.mark.parametrize("job", JOBS)
def test_every_write_killed_then_a_plain_rerun_finishes_the_same(
    job: str,
    chain: tuple[Path, dict[str, Path]],
    server: ForkServer,
    index: IndexSnapshots,
    tmp_path: Path,
) -> None:
    store, before = chain
    sets, code = next((s, c) for j, s, c in CHAIN if j == job)

    def restore() -> None:
        _restore(store, before[job])
        index.restore(job)

    run_matrix(
        job,
        lambda *args, env: server.run(job, *args, env={INDEX_DSN_ENV: index.dsn, **env}),
        (f"artifact_root=file://{store}", *chain_sets(sets, f"file://{store}")),
        code,
        restore=restore,
        state=lambda: {**state(store), **index.state()},
        leftovers=lambda: leftovers(store),
        logs=tmp_path,
    )


def test_a_sample_kills_every_chosen_operation_and_replays_from_its_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """:class:`Sample` (the S3 matrix's): every point of an ``always`` operation, ``k`` of
    the rest in the job's order; the same seed draws the same points, the variable sets it."""
    points = [f"{n} {op} p{n}" for n, op in enumerate(["cas", *["write"] * 10, "put"], 1)]
    points += ["13 db index/t/part", "rank1: 14 remove x"]
    sample = Sample(always=frozenset({"cas", "put", "remove"}), k=3, seed="abc")
    chosen = sample.choose("train (s3)", points)
    assert [p for p in chosen if point_op(p) in sample.always] == [
        "1 cas p1", "12 put p12", "rank1: 14 remove x",
    ]  # fmt: skip
    assert len(chosen) == 6 and chosen == [p for p in points if p in chosen]
    assert Sample(sample.always, 3, "abc").choose("train (s3)", points) == chosen
    draws = {
        tuple(Sample(sample.always, 3, str(s)).choose("train (s3)", points)) for s in range(20)
    }
    assert len(draws) > 1, "the seed changes nothing"
    assert Sample(sample.always, 99, "abc").choose("x", points) == points
    assert "EMBEDFRESH_FAULT_SAMPLE_SEED=abc" in sample.describe("train (s3)", chosen, points)
    monkeypatch.setenv(SAMPLE_SEED, "replay-me")
    assert sample_seed() == "replay-me"
    monkeypatch.delenv(SAMPLE_SEED)
    assert sample_seed()  # the commit, or the fallback without git
