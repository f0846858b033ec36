"""The model registry, release documents and the release job, on a local disk and on S3
(moto's server on 127.0.0.1): concurrent releases have exactly one winner, anything but a
PASS leaves registry.json byte-identical, a corrupted registry is an error and never
reset, only committed versions go live, a release document is written once and never
changed, and a registry written before releases reads as a legacy bare release that the
next release moves from.

The releases here carry no corpora (``corpora=[]``): the registry's mechanics need no
vector index."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import json
import os
import threading

import pytest

from embedfresh.core import layout
from embedfresh.core.config import GateConfig, ReleaseConfig, RollbackConfig
from embedfresh.core.exit_codes import BadInputError, ConflictError, ExitCode, GateRefusedError
from embedfresh.core.registry import Registry
from embedfresh.core.releases import (
    Release,
    kept_releases,
    live_release,
    read_release,
    release_doc,
    release_history,
    write_release,
)
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.gate import run_gate
from embedfresh.jobs.release import release
from embedfresh.jobs.rollback import rollback
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import run_job

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "tiny"
VERSIONS = ("v1", "v2", "v3")
ROUNDS = 6
_buckets = itertools.count()


@pytest.fixture(scope="module")
def weights() -> dict:
    """One set of tiny weights, published under several version names below."""
    return cpu_state_dict(versions.build_model(get_spec(MODEL), seed=0))


@pytest.fixture(scope="module")
def atomic_moto_put():
    """Make moto's conditional PUT atomic, as it is on S3.

    moto's server checks If-Match / If-None-Match and stores the object in two steps with
    no lock between them, so two PUTs arriving together could in rare cases both pass the
    check, which real S3 never allows. The lock restores that contract; the code under
    test still has to send the condition: an unconditional PUT would let both writers win
    and fail these tests.
    """
    try:
        from moto.s3.responses import S3Response
    except ImportError:  # pragma: no cover - moto's layout changed; run without the lock
        yield
        return
    original = S3Response.put_object
    lock = threading.Lock()

    @functools.wraps(original)
    def put_object(self, *args, **kwargs):
        with lock:
            return original(self, *args, **kwargs)

    S3Response.put_object = put_object
    try:
        yield
    finally:
        S3Response.put_object = original


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path, weights) -> ArtifactStore:
    """A fresh store with versions v1..v3 committed, on a local disk or in a fresh bucket."""
    if request.param == "file":
        store = ArtifactStore(f"file://{tmp_path / 'root'}")
    else:
        import boto3

        endpoint = request.getfixturevalue("s3_endpoint")
        request.getfixturevalue("atomic_moto_put")
        bucket = f"registry-{next(_buckets)}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        store = ArtifactStore(f"s3://{bucket}/prod")
    spec = get_spec(MODEL)
    for name in VERSIONS:
        versions.publish(store, spec, name, weights, {})
    return store


def write_gate(
    store: ArtifactStore, run_id: str, candidate: str, production: str | None, verdict="PASS"
) -> None:
    """The gate report the release job acts on, as the gate job writes it."""
    store.write_json(
        layout.report(MODEL, run_id, "gate"),
        {
            "verdict": verdict,
            "mode": "no_regression",
            "tolerance": 0.001,
            "model": MODEL,
            "run_id": run_id,
            "candidate": {"version": candidate, "metrics": {"accuracy": 0.7}},
            "reference": {
                "version": production or "baseline",
                "source": "production" if production else "baseline",
                "metrics": {"accuracy": 0.7},
            },
            "production_at_decision": production,
            "metrics": [{"metric": "accuracy", "d": 0.0, "ci_low": -0.0005, "ci_high": 0.0005}],
        },
    )


def gated_version(store: ArtifactStore, run_id: str) -> str:
    """The candidate the run's gate decided on (what the run released)."""
    return store.read_json(layout.report(MODEL, run_id, "gate"))["candidate"]["version"]


def release_run(store: ArtifactStore, run_id: str, version: str | None = None) -> dict:
    """The release job for the run's gated candidate, without corpora."""
    version = version or gated_version(store, run_id)
    cfg = ReleaseConfig(
        artifact_root=store.root, model=MODEL, run_id=run_id, version=version, corpora=[]
    )
    return release(cfg)


def registry_bytes(store: ArtifactStore) -> bytes | None:
    rel = layout.registry(MODEL)
    return store.read_bytes(rel) if store.exists(rel) else None


def race(store: ArtifactStore, runs: list[str]) -> list[dict | BaseException]:
    """Release ``runs`` from threads released together; each gets its own store client."""
    barrier = threading.Barrier(len(runs), timeout=30)
    outcomes: list[dict | BaseException | None] = [None] * len(runs)

    def attempt(i: int) -> None:
        own = ArtifactStore(store.root)  # as a separate process would
        barrier.wait()
        try:
            outcomes[i] = release_run(own, runs[i])
        except BaseException as e:  # reported to the test thread below
            outcomes[i] = e

    threads = [
        threading.Thread(target=attempt, args=(i,), name=f"contender-{i}") for i in range(len(runs))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a release hung"
    for o in outcomes:
        if isinstance(o, BaseException) and not isinstance(o, ConflictError):
            raise o
    return outcomes


def check_one_winner(
    store: ArtifactStore,
    outcomes: list,
    runs: list[str],
    contenders: list[str],
    previous: str | None,
    previous_release: str | None,
) -> tuple[str, str]:
    winners = [i for i, o in enumerate(outcomes) if isinstance(o, dict)]
    assert len(winners) == 1, outcomes
    (w,) = winners
    losers = [o for o in outcomes if isinstance(o, ConflictError)]
    assert len(losers) == len(runs) - 1, outcomes
    for e in losers:
        assert e.exit_code == ExitCode.BAD_INPUT
        msg = str(e)
        assert "registry.json" in msg
        assert "another run released first" in msg or "a concurrent run won" in msg, msg
    doc, _ = Registry(store, MODEL).read()
    assert outcomes[w]["production"] == contenders[w]
    assert outcomes[w]["release"] == runs[w]
    assert doc["production"]["version"] == contenders[w]
    assert doc["production"]["release"] == runs[w]
    assert doc["production"]["run_id"] == runs[w]
    assert doc["history"][-1]["previous"] == previous
    assert doc["history"][-1]["previous_release"] == previous_release
    assert doc["history"][-1]["run_id"] == runs[w]
    live = live_release(store, MODEL)
    assert (live.release, live.version) == (runs[w], contenders[w])
    return contenders[w], runs[w]


def test_concurrent_releases_have_exactly_one_winner(store):
    """Two runs gated against the same production release at once, round after round."""
    production = live = None
    for r in range(ROUNDS):
        contenders = [v for v in VERSIONS if v != production][:2]
        runs = [f"race{r}-a", f"race{r}-b"]
        for run, version in zip(runs, contenders, strict=True):
            write_gate(store, run, version, production)
        outcomes = race(store, runs)
        production, live = check_one_winner(store, outcomes, runs, contenders, production, live)
        doc, _ = Registry(store, MODEL).read()
        assert len(doc["history"]) == r + 1  # the loser added nothing


def test_both_read_before_either_writes_the_cas_decides(store, monkeypatch):
    """Force the worst interleaving: both contenders read the same registry version, then
    both write. The compare-and-swap in the store (not the early check) must refuse one.

    Only a contender's first read (the one its move decides on) waits at the barrier: the
    winner reads the registry again afterwards (the run index's update), alone, and a wait
    there would hold it for the barrier's whole timeout and cost it its index entry."""
    original = Registry.read
    barrier = threading.Barrier(2, timeout=30)
    first_read = threading.local()  # each round's contenders are new threads

    def read_then_wait(self):
        result = original(self)
        if threading.current_thread().name.startswith("contender-") and not getattr(
            first_read, "done", False
        ):
            first_read.done = True
            barrier.wait()
        return result

    monkeypatch.setattr(Registry, "read", read_then_wait)
    production = live = None
    for r in range(4):  # the first round creates registry.json, the others replace it
        barrier.reset()
        contenders = [v for v in VERSIONS if v != production][:2]
        runs = [f"cas{r}-a", f"cas{r}-b"]
        for run, version in zip(runs, contenders, strict=True):
            write_gate(store, run, version, production)
        outcomes = race(store, runs)
        production, live = check_one_winner(store, outcomes, runs, contenders, production, live)
        (loser,) = [o for o in outcomes if isinstance(o, ConflictError)]
        assert "a concurrent run won" in str(loser), loser
        assert not barrier.broken, "a contender waited at the barrier alone"


def test_stale_expected_production_is_refused(store):
    write_gate(store, "first", "v1", None)
    assert release_run(store, "first")["production"] == "v1"
    write_gate(store, "second", "v2", "v1")
    assert release_run(store, "second")["production"] == "v2"
    before = registry_bytes(store)

    # Gated while v1 (or nothing) was production; production has moved on since.
    write_gate(store, "stale", "v3", "v1")
    with pytest.raises(ConflictError, match=r"production version is 'v2', expected 'v1'"):
        release_run(store, "stale")
    write_gate(store, "stale-none", "v3", None)
    with pytest.raises(ConflictError, match=r"production version is 'v2', expected None"):
        release_run(store, "stale-none")
    assert registry_bytes(store) == before
    assert Registry(store, MODEL).production_version() == "v2"
    assert live_release(store, MODEL).release == "second"


@pytest.mark.parametrize("verdict", ["FAIL", "INCONCLUSIVE"])
def test_a_gate_that_did_not_pass_leaves_the_registry_byte_identical(store, verdict):
    # Before any production exists, a refused run must not create the registry.
    write_gate(store, "refused-first", "v1", None, verdict=verdict)
    with pytest.raises(GateRefusedError, match=f"gate verdict is {verdict}") as exc:
        release_run(store, "refused-first")
    assert exc.value.exit_code == ExitCode.GATE_REFUSED
    assert registry_bytes(store) is None
    assert not store.exists(layout.release(MODEL, "refused-first"))  # refused before it

    write_gate(store, "good", "v1", None)
    release_run(store, "good")
    before = registry_bytes(store)
    write_gate(store, "refused", "v2", "v1", verdict=verdict)
    with pytest.raises(GateRefusedError, match="the live release stays as it is"):
        release_run(store, "refused")
    assert registry_bytes(store) == before
    assert not store.exists(layout.release(MODEL, "refused"))


def test_release_job_exits_3_on_a_failed_gate(store):
    write_gate(store, "good", "v1", None)
    release_run(store, "good")
    before = registry_bytes(store)
    write_gate(store, "bad", "v2", "v1", verdict="FAIL")
    result = run_job(
        "release",
        f"artifact_root={store.root}",
        f"model={MODEL}",
        "run_id=bad",
        "version=v2",
        "corpora=[]",
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert "release: error: gate verdict is FAIL" in result.stderr
    assert registry_bytes(store) == before


def test_release_without_a_gate_report_is_bad_input(store):
    with pytest.raises(BadInputError, match="no gate report") as exc:
        release_run(store, "never-gated", "v1")
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert registry_bytes(store) is None


CORRUPT = {
    "garbage": b"\x00\xff\xfe not json at all \x80",
    "truncated": b'{"model": "tiny", "production": {"version": "v1"',
    "list": b"[1, 2, 3]",
    "string": b'"v1"',
    "wrong-model": b'{"model": "minilm", "production": null, "history": []}',
    "production-not-a-dict": b'{"model": "tiny", "production": "v1", "history": []}',
    "version-not-a-string": b'{"model": "tiny", "production": {"version": 5}, "history": []}',
    "no-history": b'{"model": "tiny", "production": {"version": "v1"}}',
}


@pytest.mark.parametrize("content", list(CORRUPT.values()), ids=list(CORRUPT))
def test_corrupted_registry_is_an_error_and_never_reset(store, content):
    store.write_bytes(layout.registry(MODEL), content)
    registry = Registry(store, MODEL)
    expected = r"registry .*registry\.json (is corrupted|does not have the registry structure)"

    with pytest.raises(BadInputError, match=expected):
        registry.read()
    with pytest.raises(BadInputError, match=expected):
        registry.production_version()
    # A search service's one call refuses it too, rather than serve a guess.
    with pytest.raises(BadInputError, match=expected):
        live_release(store, MODEL)
    write_gate(store, "after-corruption", "v1", None)
    with pytest.raises(BadInputError, match=expected):
        release_run(store, "after-corruption")
    with pytest.raises(BadInputError, match=expected):
        registry.release(
            Release(model=MODEL, release="v1", version="v1"),
            details={"run_id": "direct"},
            expected_version=None,
        )
    with pytest.raises(BadInputError, match=expected):
        rollback(
            RollbackConfig(
                artifact_root=store.root, model=MODEL, to_release="after-corruption", reason="x"
            )
        )
    # The gate reads production first: it refuses too rather than gate against a guess.
    with pytest.raises(BadInputError, match=expected):
        run_gate(GateConfig(artifact_root=store.root, model=MODEL, run_id="after-corruption"))
    assert registry_bytes(store) == content


def test_corrupted_registry_release_job_exits_2(store):
    content = CORRUPT["garbage"]
    store.write_bytes(layout.registry(MODEL), content)
    write_gate(store, "r", "v1", None)
    result = run_job(
        "release",
        f"artifact_root={store.root}",
        f"model={MODEL}",
        "run_id=r",
        "version=v1",
        "corpora=[]",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "is corrupted" in result.stderr and "never reset" in result.stderr
    assert registry_bytes(store) == content


def test_releasing_a_version_that_is_not_committed_is_refused(store, weights):
    write_gate(store, "ghost", "never-published", None)
    with pytest.raises(BadInputError, match="never-published is not committed"):
        release_run(store, "ghost")
    assert registry_bytes(store) is None

    # A half-published version: weights and config written, COMMIT marker missing.
    spec = get_spec(MODEL)
    versions.publish(store, spec, "partial", weights, {})
    store.remove(f"{layout.model_version(MODEL, 'partial')}/COMMIT")
    assert store.exists(f"{layout.model_version(MODEL, 'partial')}/model.safetensors")
    write_gate(store, "half", "partial", None)
    with pytest.raises(BadInputError, match="partial is not committed"):
        release_run(store, "half")
    assert registry_bytes(store) is None

    # With a production in place the refusal leaves it byte-identical.
    write_gate(store, "good", "v1", None)
    release_run(store, "good")
    before = registry_bytes(store)
    write_gate(store, "half-again", "partial", "v1")
    with pytest.raises(BadInputError, match="is not committed"):
        release_run(store, "half-again")
    with pytest.raises(BadInputError, match="is not committed"):
        Registry(store, MODEL).release(
            Release(model=MODEL, release="nope", version="nope"),
            details={"run_id": "direct"},
            expected_version="v1",
        )
    assert registry_bytes(store) == before
    assert live_release(store, MODEL).release == "good"


def test_registry_history_records_each_release(store):
    production = None
    for i, version in enumerate(["v1", "v2", "v3", "v1"]):  # an earlier version, released anew
        write_gate(store, f"run{i}", version, production)
        release_run(store, f"run{i}")
        production = version
    doc = json.loads(registry_bytes(store))
    assert doc["model"] == MODEL
    assert doc["production"]["version"] == "v1"
    assert doc["production"]["release"] == "run3"
    assert [h["version"] for h in doc["history"]] == ["v1", "v2", "v3", "v1"]
    assert [h["previous"] for h in doc["history"]] == [None, "v1", "v2", "v3"]
    assert [h["release"] for h in doc["history"]] == ["run0", "run1", "run2", "run3"]
    assert [h["previous_release"] for h in doc["history"]] == [None, "run0", "run1", "run2"]
    assert {h["action"] for h in doc["history"]} == {"promote"}
    assert all(h["corpora"] == [] for h in doc["history"])
    assert doc["production"]["gate_report"].endswith("runs/tiny/run3/reports/gate.json")
    assert doc["production"]["release_url"] == store.url(layout.release(MODEL, "run3"))
    assert release_history(doc) == ["run3", "run2", "run1", "run0"]
    assert kept_releases(doc, 2) == ["run3", "run2"]
    # Each release document names its version and the gate it went live on.
    for i, version in enumerate(["v1", "v2", "v3", "v1"]):
        made = read_release(store, MODEL, f"run{i}")
        assert (made.version, made.bare, made.legacy) == (version, True, False)
        assert made.doc["gate"]["verdict"] == "PASS"
        assert made.doc["gate"]["report"].endswith(f"runs/tiny/run{i}/reports/gate.json")


# -- a release document is written once ---------------------------------------------------


def a_release(store: ArtifactStore, release_id: str, version: str, **kw) -> dict:
    fields = dict(
        model=MODEL,
        release=release_id,
        version=version,
        version_url=store.url(layout.model_version(MODEL, version)),
        run_id=release_id,
        action="promote",
        corpora={},
        gate={"verdict": "PASS", "report": None},
        created_at="2026-01-01T00:00:00+00:00",
    )
    return release_doc(**{**fields, **kw})


def test_a_release_document_is_written_once(store):
    """A re-run's identical release (another created_at) keeps the stored bytes; other
    contents under the same id are a conflict, and the stored bytes stay."""
    rel = layout.release(MODEL, "r1")
    made, written = write_release(store, a_release(store, "r1", "v1"))
    assert written is True and made.release == "r1" and made.url == store.url(rel)
    stored = store.read_bytes(rel)
    assert json.loads(stored)["created_at"] == "2026-01-01T00:00:00+00:00"

    later = a_release(store, "r1", "v1", created_at="2026-01-02T09:30:00+00:00")
    again, written = write_release(store, later)
    assert written is False
    assert again.doc["created_at"] == "2026-01-01T00:00:00+00:00"  # the stored one
    assert store.read_bytes(rel) == stored

    for other in (
        a_release(store, "r1", "v2"),  # another version
        a_release(store, "r1", "v1", action="promote_anyway", who="bob", why="x"),
        a_release(store, "r1", "v1", gate={"verdict": "PASS", "report": "elsewhere"}),
    ):
        with pytest.raises(ConflictError, match=r"r1\.json exists with other contents") as exc:
            write_release(store, other)
        assert exc.value.exit_code == ExitCode.BAD_INPUT
        assert store.read_bytes(rel) == stored
    assert read_release(store, MODEL, "r1").version == "v1"


def test_a_rerun_of_the_release_job_keeps_its_release_document(store, monkeypatch):
    """The job killed after its release document, before the pointer moved: the retry
    (later: another created_at) finds the document, keeps it, and moves the pointer."""
    write_gate(store, "run", "v1", None)
    rel = layout.release(MODEL, "run")

    def killed(self, *args, **kwargs):
        raise KeyboardInterrupt("killed before the pointer moved")

    monkeypatch.setattr(Registry, "release", killed)
    with pytest.raises(KeyboardInterrupt):
        release_run(store, "run")
    monkeypatch.undo()
    assert registry_bytes(store) is None
    first = store.read_json(rel)
    first["created_at"] = "2026-01-01T00:00:00+00:00"  # the first attempt, long ago
    store.write_json(rel, first)
    stored = store.read_bytes(rel)

    summary = release_run(store, "run")
    assert summary["already"] is False and summary["release"] == "run"
    assert store.read_bytes(rel) == stored
    assert live_release(store, MODEL).doc["created_at"] == "2026-01-01T00:00:00+00:00"


# -- a registry written before releases ------------------------------------------------------


LEGACY_ENTRY = {
    "run_id": "scheduled__2026-01-01",
    "verdict": "PASS",
    "mode": "no_regression",
    "reference": "baseline",
    "previous": None,
    "promoted_at": "2026-01-01T03:00:00+00:00",
    "version": "v1",
}


def test_a_registry_from_before_releases_reads_as_a_legacy_bare_release(store):
    legacy = {
        "model": MODEL,
        "production": {k: v for k, v in LEGACY_ENTRY.items() if k != "previous"},
        "history": [LEGACY_ENTRY],
    }
    store.write_bytes(layout.registry(MODEL), json.dumps(legacy).encode())

    live = live_release(store.root, MODEL)
    assert live is not None
    assert (live.version, live.release, live.legacy, live.bare) == ("v1", None, True, True)
    assert live.corpora == {} and live.url is None
    with pytest.raises(BadInputError, match=r"production v1 of tiny has no corpus 'products'"):
        live.corpus("products")
    assert release_history(legacy) == []  # no release to roll back to

    # The next release moves from it, gated against its version; the history keeps it.
    write_gate(store, "next", "v2", "v1")
    summary = release_run(store, "next")
    assert summary["production"] == "v2" and summary["previous"] == "v1"
    assert summary["release"] == "next" and summary["previous_release"] is None
    doc = json.loads(registry_bytes(store))
    assert doc["history"][0] == LEGACY_ENTRY
    assert len(doc["history"]) == 2
    entry = doc["history"][1]
    assert entry["release"] == "next" and entry["previous"] == "v1"
    assert entry["previous_release"] is None
    now = live_release(store.root, MODEL)
    assert (now.release, now.version, now.legacy) == ("next", "v2", False)
    assert release_history(doc) == ["next"]


def test_a_legacy_production_refuses_a_release_gated_against_another(store):
    """The compare-and-swap holds against a legacy entry too."""
    legacy = {"model": MODEL, "production": {"version": "v1"}, "history": [{"version": "v1"}]}
    store.write_bytes(layout.registry(MODEL), json.dumps(legacy).encode())
    before = registry_bytes(store)
    write_gate(store, "first-ever", "v2", None)
    with pytest.raises(ConflictError, match=r"production version is 'v1', expected None"):
        release_run(store, "first-ever")
    assert registry_bytes(store) == before
    assert live_release(store, MODEL).legacy is True


def test_release_created_at_is_recorded(store):
    write_gate(store, "first", "v1", None)
    release_run(store, "first")
    made = read_release(store, MODEL, "first")
    age = dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(made.doc["created_at"])
    assert dt.timedelta(0) <= age < dt.timedelta(minutes=5)
    assert made.doc["run_id"] == "first" and made.doc["action"] == "promote"
    assert "who" not in made.doc  # a gated release is the gate's decision, no person's
