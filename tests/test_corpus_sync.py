"""The live index follows its corpus: change sets applied to a release's table by
``embedfresh.jobs.corpus_sync`` against a real PostgreSQL 18 + pgvector.

One release is made for the module (release r1 of the tiny model's v1 with the
generated ``products`` corpus, 600 documents) in a database of its own; each test that
writes works on a copy of its store and a clone of its database (``CREATE DATABASE ...
TEMPLATE``). The landing of the issue: 1,000 documents added in one change set, then 500
changed and 300 deleted in the next, in many scripts; the table must end equal to a
from-scratch embed of the corpus at the watermark. Its fault points are in the
fault-point matrix (tests/reliability/test_fault_points.py's chain); the DAG runs in
tests/test_dags.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from pgvector.psycopg import register_vector

from embedfresh.core import layout
from embedfresh.core.changes import DELETE, UPSERT, read_change_set
from embedfresh.core.config import (
    CorpusDiffConfig,
    CorpusSyncConfig,
    EmbedConfig,
    IndexAttachConfig,
    IndexLoadConfig,
    ReleaseConfig,
    RollbackConfig,
    SearchCheckConfig,
    SearchConfig,
)
from embedfresh.core.embedding_sets import iter_parts, read_embedding_set
from embedfresh.core.exit_codes import BadInputError, ExitCode
from embedfresh.core.index import live_view_name, open_index, table_name
from embedfresh.core.registry import Registry
from embedfresh.core.releases import live_release, read_release
from embedfresh.core.settings import INDEX_DSN_ENV
from embedfresh.core.storage import ArtifactStore
from embedfresh.core.storage.faults import FAULT_POINT, WRITES_LOG
from embedfresh.jobs.corpus_diff import corpus_diff
from embedfresh.jobs.corpus_sync import corpus_sync
from embedfresh.jobs.embed import embed
from embedfresh.jobs.embed_verify import verify
from embedfresh.jobs.index_attach import index_attach
from embedfresh.jobs.index_load import index_load
from embedfresh.jobs.release import release
from embedfresh.jobs.rollback import rollback
from embedfresh.jobs.search import search
from embedfresh.jobs.search_check import search_check
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.data.generate import parquet_bytes
from embedfresh.ml.embedding.query import ReleaseEncoder
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.airflow_home import promote_initial_version
from tests.conftest import database_url, run_job
from tests.golden import fresh_database
from tests.releasing import release_run, write_pass_gate

pytestmark = pytest.mark.slow

MODEL, CORPUS = "tiny", "products"
WORDS = ("waterproof", "ботинки", "παπούτσια", "防水靴", "حذاء", "जूते", "randonnée", "靴下")


def texts(n: int, seed: int) -> list[str]:
    """``n`` texts in many scripts, none like the generated corpus's."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 40)))) + f" #{seed}-{i}"
            for i in range(n)]  # fmt: skip


def change_set(ops: list[str], ids: list, text: list[str | None]) -> bytes:
    return parquet_bytes(
        pa.table(
            {
                "op": pa.array(ops, pa.string()),
                "id": ids if isinstance(ids, pa.Array) else pa.array(ids),
                "text": pa.array(text, pa.string()),
            }
        )
    )


def land(store: ArtifactStore, name: str, data: bytes) -> None:
    store.write_bytes(layout.change_set(CORPUS, name), data)


@pytest.fixture(scope="module")
def released(data_template: Path, tmp_path_factory, pg_server: str) -> tuple[Path, str]:
    """Release r1 (v1 with ``products``) in a store and a database of its own: their
    path and the database's name; a pristine copy of the database, ``<name>_pristine``,
    is the template each test's database is made from."""
    path = tmp_path_factory.mktemp("sync-world") / "store"
    shutil.copytree(data_template, path)
    name = f"sync_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv(INDEX_DSN_ENV, fresh_database(pg_server, name))
        root = f"file://{path}"
        promote_initial_version(root, "v1")
        release_run(root, "r1", version="v1", regression="report")
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}_pristine WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}_pristine TEMPLATE {name}")
    return path, name


@pytest.fixture
def world(released, tmp_path: Path, pg_server: str, monkeypatch) -> ArtifactStore:
    """A copy of the released store, its index the release's database made again from
    the pristine copy (under the same name: the release records where its table is)."""
    path, name = released
    dest = tmp_path / "store"
    shutil.copytree(path, dest)
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {name}_pristine")
    monkeypatch.setenv(INDEX_DSN_ENV, database_url(pg_server, name))
    return ArtifactStore(f"file://{dest}")


def corpus_now(store: ArtifactStore) -> dict[int, str]:
    """The corpus snapshot's ids and texts."""
    from embedfresh.core.shards import corpus_shards, read_corpus_shard

    out: dict[int, str] = {}
    for part in corpus_shards(store, CORPUS).values():
        ids, text = read_corpus_shard(store, f"{layout.corpus(CORPUS)}/{part}")
        out.update(zip(ids.tolist(), text, strict=True))
    return out


def table_rows(store: ArtifactStore) -> dict[int, np.ndarray]:
    table = live_release(store, MODEL).corpus(CORPUS).table
    with psycopg.connect(os.environ[INDEX_DSN_ENV]) as conn:
        register_vector(conn)
        rows = conn.execute(f'SELECT id, embedding FROM embedfresh."{table}"').fetchall()
    return {int(i): np.asarray(v.to_numpy(), dtype=np.float32) for i, v in rows}


def sync(store: ArtifactStore, run_id: str) -> dict:
    return corpus_sync(
        CorpusSyncConfig(artifact_root=store.root, model=MODEL, run_id=run_id, corpus=CORPUS)
    )


def candidate(store: ArtifactStore, *, load: bool = True) -> dict:
    """Run r2's candidate, version v2 (the tiny model, another init), published and its
    products embedded and verified (and, with ``load``, loaded into the index): the
    jobs' common settings."""
    spec = get_spec("tiny")
    versions.publish(store, spec, "v2", cpu_state_dict(versions.build_model(spec, 1)), {})
    common = {"artifact_root": store.root, "model": MODEL, "run_id": "r2", "version": "v2"}
    embed(EmbedConfig(**common, corpus=CORPUS))
    verify(EmbedConfig(**common, corpus=CORPUS))
    if load:
        index_load(IndexLoadConfig(**common, corpus=CORPUS))
    return common


def test_a_landing_leaves_the_table_equal_to_a_from_scratch_embed_at_the_watermark(world):
    store = world
    corpus = corpus_now(store)
    old = sorted(corpus)
    new_ids = list(range(10**9, 10**9 + 1000))
    land(store, "2026-12-06T10-00-00Z", change_set([UPSERT] * 1000, new_ids, texts(1000, 1)))
    rng = np.random.default_rng(7)
    shuffled = rng.permutation(old + new_ids).tolist()
    changed, deleted = shuffled[:500], shuffled[500:800]  # old and new ids alike
    land(
        store,
        "2026-12-06T11-00-00Z",
        change_set(
            [UPSERT] * 500 + [DELETE] * 300,
            changed + deleted,
            texts(500, 2) + [None] * 300,
        ),
    )
    first = sync(store, "s1")
    assert (first["applied_now"], first["upserts_now"], first["deletes_now"]) == (2, 1500, 300)
    assert first["watermark"] == "2026-12-06T11-00-00Z"

    # The corpus at the watermark, embedded from scratch by the embed job.
    corpus.update(zip(new_ids, texts(1000, 1), strict=True))
    corpus.update(zip(changed, texts(500, 2), strict=True))
    for i in deleted:
        del corpus[i]
    ids = np.asarray(sorted(corpus), dtype=np.int64)
    half = len(ids) // 2
    for index, part in enumerate((ids[:half], ids[half:])):
        store.write_bytes(
            f"{layout.corpus('at_watermark')}/{layout.part_name(index)}",
            parquet_bytes(pa.table({"id": part, "text": [corpus[i] for i in part.tolist()]})),
        )
    common = {"artifact_root": store.root, "model": MODEL, "run_id": "scratch", "version": "v1"}
    embed(EmbedConfig(**common, corpus="at_watermark"))
    verify(EmbedConfig(**common, corpus="at_watermark"))
    scratch = {}
    for _, part_ids, vectors in iter_parts(
        store, read_embedding_set(store, MODEL, "v1", "at_watermark")
    ):
        scratch.update(zip(part_ids.tolist(), vectors, strict=True))

    table = table_rows(store)
    assert sorted(table) == sorted(scratch) == ids.tolist()
    cosines = np.asarray([float(table[i] @ scratch[i]) for i in ids.tolist()])
    assert cosines.min() >= 0.99999, (cosines.min(), ids[cosines.argmin()])

    # A deleted document is never found, even by its own vector.
    release = live_release(store, MODEL)
    before = {}
    for _, part_ids, vectors in iter_parts(store, read_embedding_set(store, MODEL, "v1", CORPUS)):
        before.update(zip(part_ids.tolist(), vectors, strict=True))
    gone = [i for i in deleted if i in before]
    assert gone
    entry = release.corpus(CORPUS)
    with open_index(store.root) as index:
        found = index.search(entry.table, np.stack([before[i] for i in gone]), 10,
                             ef_search=entry.index["ann"]["ef_search"])  # fmt: skip
    assert not set(np.concatenate(found.ids).tolist()) & set(deleted)

    # The record says what the table holds; a re-run applies nothing and changes nothing.
    record = store.read_json(layout.sync_record(MODEL, "r1", CORPUS))
    assert record["watermark"] == "2026-12-06T11-00-00Z" and record["rows"] == len(ids)
    assert [c["name"] for c in record["change_sets"]] == [
        "2026-12-06T10-00-00Z", "2026-12-06T11-00-00Z",
    ]  # fmt: skip
    again = sync(store, "s2")
    assert again["applied_now"] == 0 and again["watermark"] == first["watermark"]
    assert {i: v.tobytes() for i, v in table_rows(store).items()} == {
        i: v.tobytes() for i, v in table.items()
    }


BAD = {
    "unknown op": (["insert"], [1], ["a"], "column op is 'insert' at row 0"),
    "null op": ([None], [1], ["a"], "column op is null at row 0"),
    "string id in an int64 corpus": ([UPSERT], ["sku-1"], ["a"], "column id is string"),
    "null id": ([UPSERT, UPSERT], [1, None], ["a", "b"], "column id is null at row 1"),
    "an id twice": ([UPSERT, DELETE], [5, 5], ["a", None], "has 5 more than once (again at row 1)"),
    "upsert without text": ([DELETE, UPSERT], [1, 2], [None, None], "text is null at row 1"),
    "upsert with empty text": ([UPSERT], [3], [""], "text is empty at row 0"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_change_set_is_refused_naming_file_column_and_row_and_nothing_applied(world, case):
    """A good change set lands before the bad one, and neither is applied (everything is
    validated before the first write)."""
    store = world
    ops, ids, text, words = BAD[case]
    land(store, "a-good", change_set([UPSERT], [10**9], ["fine"]))
    land(store, "b-bad", change_set(ops, ids, text))
    with pytest.raises(BadInputError, match="b-bad.parquet") as refused:
        sync(store, "bad")
    assert words in str(refused.value), str(refused.value)
    assert not store.exists(layout.sync_record(MODEL, "r1", CORPUS))
    assert not store.exists(layout.report(MODEL, "bad", f"sync-{CORPUS}"))
    with open_index(store.root) as index:
        table = live_release(store, MODEL).corpus(CORPUS).table
        assert index.applied_changes(table) == {}
        assert index.count(table) == 600


def test_a_change_set_changed_after_it_was_applied_exits_2_and_the_command_says_so(world):
    land(world, "c1", change_set([DELETE], [0], [None]))
    assert sync(world, "s1")["deletes_now"] == 1
    land(world, "c1", change_set([DELETE], [1], [None]))
    done = run_job("corpus_sync", f"artifact_root={world.root}", "run_id=s2")
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert "changes/c1.parquet was applied to" in done.stderr
    assert "land the correction as a new change set" in done.stderr
    # One that lands late and sorts before what the table holds is refused, not applied
    # out of the corpus's order.
    land(world, "c1", change_set([DELETE], [0], [None]))
    land(world, "b1", change_set([DELETE], [1], [None]))
    with pytest.raises(BadInputError, match="b1.parquet sorts before c1"):
        sync(world, "s3")


def first_vectors(store: ArtifactStore, version: str) -> dict:
    """Ids and vectors of the first part of ``version``'s products embeddings."""
    _, ids, vectors = next(iter_parts(store, read_embedding_set(store, MODEL, version, CORPUS)))
    return dict(zip(ids.tolist(), vectors, strict=True))


def test_readers_of_the_registry_and_of_the_view_never_see_a_model_with_another_s_vectors(
    world, tmp_path
):
    """r2 (another model version) is released and the release is killed right after its
    compare-and-swap; a reader polls the live release's table (through the registry) and
    the live view (whose rows name their version) throughout. Each always finds the
    vectors of the model it names; the corpus sync then repairs the view."""
    store = world
    common = candidate(store)
    search_check(SearchCheckConfig(**common, corpus=CORPUS, regression="report"))
    write_pass_gate(store, MODEL, "r2", "v2")
    truth = {v: first_vectors(store, v) for v in ("v1", "v2")}
    probe = next(iter(truth["v1"]))
    assert not np.allclose(truth["v1"][probe], truth["v2"][probe])

    # The release's compare-and-swap point, from a clean run on a copy.
    path = Path(store.root.removeprefix("file://"))
    shutil.copytree(path, tmp_path / "before-release")
    sets = [f"artifact_root={store.root}", "run_id=r2", "version=v2", f'corpora=["{CORPUS}"]']
    log = tmp_path / "release-writes.log"
    assert run_job("release", *sets, env={WRITES_LOG: str(log)}).returncode == 0
    point = next(p for p in log.read_text().splitlines() if p.endswith("registry.json"))
    shutil.rmtree(path)
    shutil.copytree(tmp_path / "before-release", path)
    with open_index(store.root) as index:
        index.switch_live(MODEL, CORPUS, table_name(MODEL, "r1", CORPUS))

    seen: list[tuple[str, str]] = []
    errors: list[str] = []
    stop = threading.Event()
    view = live_view_name(MODEL, CORPUS)

    def poll() -> None:
        try:
            looks()
        except BaseException as e:  # noqa: BLE001 - recorded, the test fails on it
            errors.append(repr(e))

    def wait_for(looked: int) -> None:
        deadline = time.monotonic() + 60
        while len(seen) < looked:
            assert reader.is_alive() and time.monotonic() < deadline, errors[:3]
            time.sleep(0.05)

    def looks() -> None:
        with psycopg.connect(os.environ[INDEX_DSN_ENV], autocommit=True) as conn:
            register_vector(conn)
            while not stop.is_set():
                release = live_release(store, MODEL)
                table = release.corpus(CORPUS).table
                got = conn.execute(
                    f'SELECT embedding FROM embedfresh."{table}" WHERE id = %s', (probe,)
                ).fetchone()[0]
                if not np.allclose(got.to_numpy(), truth[release.version][probe], atol=1e-6):
                    errors.append(f"registry names {release.version}, its table has other vectors")
                named, vector = conn.execute(
                    f'SELECT version, embedding FROM embedfresh."{view}" WHERE id = %s', (probe,)
                ).fetchone()
                if not np.allclose(vector.to_numpy(), truth[named][probe], atol=1e-6):
                    errors.append(f"the view names {named}, its rows have other vectors")
                seen.append((release.version, named))

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        killed = run_job("release", *sets, env={FAULT_POINT: point})
        assert killed.returncode == -9, killed.stderr[-1500:]
        wait_for(len(seen) + 5)
        assert seen[-1] == ("v2", "v1")  # the kill's window: each reader still whole
        repaired = sync(store, "s1")
        assert repaired["view_repaired"] == "switched"
        wait_for(len(seen) + 5)
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[:3]
    assert seen[0] == ("v1", "v1") and seen[-1] == ("v2", "v2")
    assert sync(store, "s2")["view_repaired"] is None
    # The repair's compare-and-swap: a switch in between, even one that changed nothing
    # (a rollback to what is live), makes a repair that read the state before it a no-op.
    with open_index(store.root) as index:
        before = index.live_state(MODEL, CORPUS)
        assert index.switch_live(MODEL, CORPUS, before[0]) is False
        assert index.live_state(MODEL, CORPUS)[0] == before[0]
        assert index.live_state(MODEL, CORPUS)[1] != before[1]
        r1 = table_name(MODEL, "r1", CORPUS)
        assert index.switch_live(MODEL, CORPUS, r1, only_from=before) is False
        assert index.live_state(MODEL, CORPUS)[0] == before[0]


def test_a_refresh_while_the_corpus_moves_releases_the_corpus_at_the_last_watermark(world):
    """Change set A lands before the refresh, B while it embeds (its load catches the
    table up with both before the search check), C after its release (the corpus sync
    of the live release applies it). r2's table ends as the corpus after A, B and C."""
    store = world
    snapshot = corpus_now(store)
    old = sorted(snapshot)
    land(store, "a", change_set([UPSERT, DELETE], [10**9, old[0]], ["added by a", None]))
    common = candidate(store, load=False)
    land(store, "b", change_set([UPSERT, UPSERT], [old[1], 10**9 + 1], ["b's title", "new in b"]))
    loaded = index_load(IndexLoadConfig(**common, corpus=CORPUS))
    report = store.read_json(loaded["report"].removeprefix(store.root + "/"))
    assert report["change_sets_applied_now"] == ["a", "b"] and report["watermark"] == "b"
    checked = search_check(SearchCheckConfig(**common, corpus=CORPUS, regression="report"))
    assert checked["verdict"] == "PASS", checked
    write_pass_gate(store, MODEL, "r2", "v2")
    release(ReleaseConfig(**common, corpora=[CORPUS]))
    land(store, "c", change_set([DELETE, UPSERT], [10**9, old[2]], [None, "c's title"]))
    synced = sync(store, "s1")
    assert synced["release"] == "r2" and synced["watermark"] == "c" and synced["applied_now"] == 1

    expected = dict(snapshot)
    del expected[old[0]]
    expected.update({old[1]: "b's title", 10**9 + 1: "new in b", old[2]: "c's title"})
    table = table_rows(store)
    assert sorted(table) == sorted(expected)
    encoder = ReleaseEncoder.for_release(store, live_release(store, MODEL), CORPUS)
    for doc in (old[1], 10**9 + 1, old[2], old[3]):
        want = encoder.documents([expected[doc]])[0]
        assert float(table[doc] @ want) >= 0.99999, doc

    # Rolled back to r1, whose table never saw a change set: D lands first, E between
    # the catch-up and the registry's move (its sync would go to r2, live until then).
    # r1's table ends as the corpus after A to E, in r1's own vectors.
    land(store, "d", change_set([UPSERT], [10**9 + 2], ["new in d"]))
    move, r1_table = Registry.rollback, read_release(store, MODEL, "r1").corpus(CORPUS).table
    at_the_move = []

    def landing_meanwhile(registry, *args, **kwargs):
        with psycopg.connect(os.environ[INDEX_DSN_ENV]) as conn:
            at_the_move.extend(conn.execute(
                f'SELECT id FROM embedfresh."{r1_table}" WHERE id = %s', (10**9 + 2,)
            ).fetchall())  # fmt: skip
        land(store, "e", change_set([DELETE], [old[3]], [None]))
        return move(registry, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Registry, "rollback", landing_meanwhile)
        back = rollback(RollbackConfig(artifact_root=store.root, model=MODEL, run_id="rb",
                                       to_release="r1", reason="r2 misbehaves"))  # fmt: skip
    assert at_the_move == [(10**9 + 2,)]  # caught up before the pointer moved
    assert back["corpora"][CORPUS]["change_sets_applied_now"] == ["a", "b", "c", "d", "e"]
    expected[10**9 + 2] = "new in d"
    del expected[old[3]]
    table = table_rows(store)
    assert live_release(store, MODEL).release == "r1" and sorted(table) == sorted(expected)
    encoder = ReleaseEncoder.for_release(store, live_release(store, MODEL), CORPUS)
    for doc in (old[1], 10**9 + 2, old[4]):
        assert float(table[doc] @ encoder.documents([expected[doc]])[0]) >= 0.99999, doc
    record = store.read_json(layout.sync_record(MODEL, "r1", CORPUS))
    assert record["watermark"] == "e" and record["rows"] == len(expected)

    # A rollback killed between its move and its view switch, then a bad change set: the
    # re-run (to the live release) still switches the view back, and leaves the bad
    # change set to the corpus sync, which refuses it (exit 2) with the view in place.
    land(store, "f", change_set(["insert"], [1], ["x"]))
    with open_index(store.root) as index:
        index.switch_live(MODEL, CORPUS, read_release(store, MODEL, "r2").corpus(CORPUS).table)
    again = rollback(RollbackConfig(artifact_root=store.root, model=MODEL, run_id="rb",
                                    to_release="r1", reason="r2 misbehaves"))  # fmt: skip
    assert again["already"] and again["live_views_switched"] == [CORPUS]
    assert again["corpora"][CORPUS]["change_sets_applied_now"] == []
    assert sorted(table_rows(store)) == sorted(expected)
    with pytest.raises(BadInputError, match="column op is 'insert'"):
        sync(store, "s2")


def test_a_sync_killed_right_after_its_change_set_committed_is_finished_by_a_plain_rerun(world):
    """The database point of the sync (a change set's upserts, deletes and ledger row, one
    transaction): killed right after it, the re-run applies nothing twice and writes the
    record. (Its store writes are every job's: the fault-point matrix kills those.)"""
    store = world
    old = sorted(corpus_now(store))
    land(store, "b0", change_set([], pa.array([], pa.int64()), []))  # empty: applied, no-op
    land(store, "c1", change_set([UPSERT, DELETE], [10**9, old[0]], ["added", None]))
    table = live_release(store, MODEL).corpus(CORPUS).table
    sets = [f"artifact_root={store.root}", "run_id=s1"]
    point = f"3 db index/{table}/changes/c1"
    killed = run_job("corpus_sync", *sets, env={FAULT_POINT: point})
    assert killed.returncode == -9, killed.stderr[-1500:]
    assert not store.exists(layout.sync_record(MODEL, "r1", CORPUS))
    done = run_job("corpus_sync", *sets)
    assert done.returncode == 0, done.stderr[-1500:]
    record = store.read_json(layout.sync_record(MODEL, "r1", CORPUS))
    assert record["watermark"] == "c1" and record["rows"] == 600
    assert [(c["name"], c["upserts"], c["deletes"]) for c in record["change_sets"]] == [
        ("b0", 0, 0), ("c1", 1, 1),
    ]  # fmt: skip
    assert sorted(table_rows(store)) == sorted([*old[1:], 10**9])


def test_a_release_that_leaves_out_a_live_corpus_is_refused_unless_it_drops_it(world):
    """r1 carries products. r2 carries none: refused, naming products, nothing written;
    with drop_corpora=["products"] it goes live and products' live view is gone (no
    reader finds r1's vectors under r2's model)."""
    store = world
    spec = get_spec("tiny")
    versions.publish(store, spec, "v2", cpu_state_dict(versions.build_model(spec, 1)), {})
    write_pass_gate(store, MODEL, "r2", "v2")
    sets = [f"artifact_root={store.root}", "run_id=r2", "version=v2", "corpora=[]"]
    refused = run_job("release", *sets)
    assert refused.returncode == ExitCode.BAD_INPUT, refused.stderr[-1500:]
    assert "carries corpora ['products'] that release r2 neither carries nor drops" in (
        refused.stderr
    )
    assert not store.exists(layout.release(MODEL, "r2"))
    done = run_job("release", *sets, 'drop_corpora=["products"]')
    assert done.returncode == 0, done.stderr[-1500:]
    assert live_release(store, MODEL).release == "r2"
    with open_index(store.root) as index:
        assert index.live_table(MODEL, CORPUS) is None
    with psycopg.connect(os.environ[INDEX_DSN_ENV]) as conn:
        view = conn.execute(
            "SELECT to_regclass(%s)", (f'embedfresh."{live_view_name(MODEL, CORPUS)}"',)
        ).fetchone()[0]
    assert view is None
    # A drop killed after the registry moved left the view: the next sync drops it, and
    # a landing for the corpus the live release no longer carries is no failure.
    with open_index(store.root) as index:
        index.switch_live(MODEL, CORPUS, table_name(MODEL, "r1", CORPUS))
    land(store, "c1", change_set([DELETE], [0], [None]))
    synced = sync(store, "s1")
    assert synced["view_repaired"] == "dropped" and synced["table"] is None, synced
    with open_index(store.root) as index:
        assert index.live_table(MODEL, CORPUS) is None


def test_a_full_snapshot_is_diffed_into_the_change_set_that_reaches_it(tmp_path):
    """String SKUs in several scripts: the corpus (two parts) with change set ``a`` on
    top, then a full snapshot; the diff lands exactly the upserts (new or retitled) and
    deletes (gone) between them, cell by cell; a re-run lands the same bytes."""
    store = ArtifactStore(f"file://{tmp_path}/store")
    base = {"sku-α": "красная кружка", "sku-β": "青い皿", "sku-γ": "green bowl", "sku-δ": "mug"}
    for index, part in enumerate((["sku-α", "sku-β"], ["sku-γ", "sku-δ"])):
        store.write_bytes(
            f"{layout.corpus('skus')}/{layout.part_name(index)}",
            parquet_bytes(pa.table({"id": part, "text": [base[i] for i in part]})),
        )
    store.write_bytes(
        layout.change_set("skus", "a"),
        change_set([UPSERT, DELETE], ["sku-ε", "sku-δ"], ["नया कप", None]),
    )
    # Now: α, β, γ, ε. The snapshot: β retitled, γ gone, ε kept, ζ new, α unchanged.
    snapshot = {"sku-α": "красная кружка", "sku-β": "青い大皿", "sku-ε": "नया कप", "sku-ζ": "قدح"}
    store.write_bytes(
        f"{layout.corpus_snapshot('skus', 's2')}/{layout.part_name(0)}",
        parquet_bytes(pa.table({"id": list(snapshot), "text": list(snapshot.values())})),
    )
    cfg = CorpusDiffConfig(artifact_root=store.root, corpus="skus", snapshot="s2")
    done = corpus_diff(cfg)
    assert (done["upserts"], done["deletes"], done["rows"]) == (2, 1, 4), done
    landed = read_change_set(store, "skus", "s2", "string")
    assert landed.upsert_ids.tolist() == ["sku-β", "sku-ζ"]
    assert landed.upsert_texts == ["青い大皿", "قدح"]
    assert landed.delete_ids.tolist() == ["sku-γ"]
    first = store.read_bytes(layout.change_set("skus", "s2"))
    assert corpus_diff(cfg)["upserts"] == 2
    assert store.read_bytes(layout.change_set("skus", "s2")) == first
    # A change set named after the snapshot: its diff would apply after it, refused.
    store.write_bytes(layout.change_set("skus", "z9"), change_set([DELETE], ["sku-α"], [None]))
    with pytest.raises(BadInputError, match=r"\['z9'\] of corpus 'skus' sort after snapshot"):
        corpus_diff(cfg)


def test_after_the_index_moved_the_check_names_the_command_and_the_attach_mends_it(
    world, released, pg_server, monkeypatch
):
    """The same data at a new address (the release's database copied under another
    name, as a new DSN reaches it): the next refresh's search check refuses, naming the
    command; after it, the live table is re-attached (nothing loaded) and the check runs."""
    store = world
    _, name = released
    moved = f"{name}_moved"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {moved} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {moved} TEMPLATE {name}")
    monkeypatch.setenv(INDEX_DSN_ENV, database_url(pg_server, moved))
    common = candidate(store)
    check = SearchCheckConfig(**common, corpus=CORPUS, regression="report")
    with pytest.raises(
        BadInputError, match="python -m embedfresh.jobs.index_attach --set model=tiny"
    ):
        search_check(check)
    attached = index_attach(IndexAttachConfig(artifact_root=store.root, run_id="a1"))
    assert attached["corpora"][CORPUS]["parts_loaded"] == 0, attached
    assert search_check(check)["verdict"] == "PASS"


def test_attached_to_another_postgresql_the_live_tables_are_loaded_there_and_searched(
    world, pg_server, monkeypatch
):
    """An empty database elsewhere: the attach loads the live release's table from the
    store (a run killed after its first part is finished by the next), with the change
    set its old table held, indexes it and points the live view at it; the search CLI
    answers from it."""
    store = world
    old = sorted(corpus_now(store))
    land(store, "c1", change_set([UPSERT, DELETE], [10**9, old[0]], ["trail shoes", None]))
    sync(store, "s1")
    monkeypatch.setenv(INDEX_DSN_ENV, fresh_database(pg_server, "sync_elsewhere"))
    # Killed right after its first part is in: the plain re-run loads the other two.
    table = live_release(store, MODEL).corpus(CORPUS).table
    point = f"2 db index/{table}/part-00000.parquet"
    killed = run_job("index_attach", f"artifact_root={store.root}", "run_id=a0",
                     env={FAULT_POINT: point})  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-1500:]
    attached = index_attach(IndexAttachConfig(artifact_root=store.root, run_id="a1"))
    assert attached["corpora"][CORPUS]["parts_loaded"] == 2, attached
    assert attached["corpora"][CORPUS]["change_sets_applied_now"] == ["c1"]
    assert sorted(table_rows(store)) == sorted([*old[1:], 10**9])
    with open_index(store.root) as index:
        assert index.live_table(MODEL, CORPUS) == live_release(store, MODEL).corpus(CORPUS).table
    found = search(SearchConfig(artifact_root=store.root, query="trail shoes", k=3))
    assert len(found["results"]) == 3
    record = store.read_json(layout.index_location(MODEL, "r1"))
    assert record["location"] == attached["location"] != record["loaded_at"][CORPUS]


def test_a_store_copied_to_another_folder_refreshes_and_searches_after_the_attach(
    data_template, tmp_path, monkeypatch
):
    """The embedded default: release r1 with its index under the store's folder; the
    store copied elsewhere (its index with it) makes the next refresh's search check
    refuse, naming the command; after it the check passes and the search CLI answers."""
    monkeypatch.delenv(INDEX_DSN_ENV, raising=False)
    first = tmp_path / "first"
    shutil.copytree(data_template, first)
    promote_initial_version(f"file://{first}", "v1")
    release_run(f"file://{first}", "r1", version="v1", regression="report")
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    store = ArtifactStore(f"file://{moved}")
    common = candidate(store)
    check = SearchCheckConfig(**common, corpus=CORPUS, regression="report")
    with pytest.raises(BadInputError, match=r"embedded:.*first.*index_attach --set model=tiny"):
        search_check(check)
    done = run_job("index_attach", f"artifact_root={store.root}", "run_id=a1")
    assert done.returncode == 0, done.stderr[-1500:]
    assert search_check(check)["verdict"] == "PASS"
    found = search(SearchConfig(artifact_root=store.root, query="red running shoes", k=3))
    assert found["release"] == "r1" and len(found["results"]) == 3
