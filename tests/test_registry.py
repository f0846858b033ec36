"""The model registry and the promote job, on a local disk and on S3 (moto's server on
127.0.0.1): concurrent promotions have exactly one winner, anything but a PASS leaves
registry.json byte-identical, a corrupted registry is an error and never reset, and only
committed versions can be promoted."""

from __future__ import annotations

import functools
import itertools
import json
import os
import threading

import pytest

from embedfresh.core import layout
from embedfresh.core.config import GateConfig, PromoteConfig
from embedfresh.core.exit_codes import BadInputError, ConflictError, ExitCode, GateRefusedError
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.gate import run_gate
from embedfresh.jobs.promote import promote
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
    """The gate report the promote job acts on, as the gate job writes it."""
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


def promote_run(store: ArtifactStore, run_id: str) -> dict:
    return promote(PromoteConfig(artifact_root=store.root, model=MODEL, run_id=run_id))


def registry_bytes(store: ArtifactStore) -> bytes | None:
    rel = layout.registry(MODEL)
    return store.read_bytes(rel) if store.exists(rel) else None


def race(store: ArtifactStore, runs: list[str]) -> list[dict | BaseException]:
    """Promote ``runs`` from threads released together; each gets its own store client."""
    barrier = threading.Barrier(len(runs), timeout=30)
    outcomes: list[dict | BaseException | None] = [None] * len(runs)

    def attempt(i: int) -> None:
        own = ArtifactStore(store.root)  # as a separate process would
        barrier.wait()
        try:
            outcomes[i] = promote_run(own, runs[i])
        except BaseException as e:  # reported to the test thread below
            outcomes[i] = e

    threads = [
        threading.Thread(target=attempt, args=(i,), name=f"contender-{i}") for i in range(len(runs))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a promotion hung"
    for o in outcomes:
        if isinstance(o, BaseException) and not isinstance(o, ConflictError):
            raise o
    return outcomes


def check_one_winner(
    store: ArtifactStore, outcomes: list, runs: list[str], contenders: list[str], previous
) -> str:
    winners = [i for i, o in enumerate(outcomes) if isinstance(o, dict)]
    assert len(winners) == 1, outcomes
    (w,) = winners
    losers = [o for o in outcomes if isinstance(o, ConflictError)]
    assert len(losers) == len(runs) - 1, outcomes
    for e in losers:
        assert e.exit_code == ExitCode.BAD_INPUT
        msg = str(e)
        assert "registry.json" in msg
        assert "another run promoted first" in msg or "a concurrent run won" in msg, msg
    doc, _ = Registry(store, MODEL).read()
    assert outcomes[w]["production"] == contenders[w]
    assert doc["production"]["version"] == contenders[w]
    assert doc["production"]["run_id"] == runs[w]
    assert doc["history"][-1]["previous"] == previous
    assert doc["history"][-1]["run_id"] == runs[w]
    return contenders[w]


def test_concurrent_promotions_have_exactly_one_winner(store):
    """Two runs gated against the same production promote at once, round after round."""
    production = None
    for r in range(ROUNDS):
        contenders = [v for v in VERSIONS if v != production][:2]
        runs = [f"race{r}-a", f"race{r}-b"]
        for run, version in zip(runs, contenders, strict=True):
            write_gate(store, run, version, production)
        outcomes = race(store, runs)
        production = check_one_winner(store, outcomes, runs, contenders, production)
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
    production = None
    for r in range(4):  # the first round creates registry.json, the others replace it
        barrier.reset()
        contenders = [v for v in VERSIONS if v != production][:2]
        runs = [f"cas{r}-a", f"cas{r}-b"]
        for run, version in zip(runs, contenders, strict=True):
            write_gate(store, run, version, production)
        outcomes = race(store, runs)
        production = check_one_winner(store, outcomes, runs, contenders, production)
        (loser,) = [o for o in outcomes if isinstance(o, ConflictError)]
        assert "a concurrent run won" in str(loser), loser
        assert not barrier.broken, "a contender waited at the barrier alone"


def test_stale_expected_previous_is_refused(store):
    write_gate(store, "first", "v1", None)
    assert promote_run(store, "first")["production"] == "v1"
    write_gate(store, "second", "v2", "v1")
    assert promote_run(store, "second")["production"] == "v2"
    before = registry_bytes(store)

    # Gated while v1 (or nothing) was production; production has moved on since.
    write_gate(store, "stale", "v3", "v1")
    with pytest.raises(ConflictError, match=r"production is 'v2', expected 'v1'"):
        promote_run(store, "stale")
    write_gate(store, "stale-none", "v3", None)
    with pytest.raises(ConflictError, match=r"production is 'v2', expected None"):
        promote_run(store, "stale-none")
    assert registry_bytes(store) == before
    assert Registry(store, MODEL).production_version() == "v2"


@pytest.mark.parametrize("verdict", ["FAIL", "INCONCLUSIVE"])
def test_a_gate_that_did_not_pass_leaves_the_registry_byte_identical(store, verdict):
    # Before any production exists, a refused run must not create the registry.
    write_gate(store, "refused-first", "v1", None, verdict=verdict)
    with pytest.raises(GateRefusedError, match=f"gate verdict is {verdict}") as exc:
        promote_run(store, "refused-first")
    assert exc.value.exit_code == ExitCode.GATE_REFUSED
    assert registry_bytes(store) is None

    write_gate(store, "good", "v1", None)
    promote_run(store, "good")
    before = registry_bytes(store)
    write_gate(store, "refused", "v2", "v1", verdict=verdict)
    with pytest.raises(GateRefusedError, match="production stays as it is"):
        promote_run(store, "refused")
    assert registry_bytes(store) == before


def test_promote_job_exits_3_on_a_failed_gate(store):
    write_gate(store, "good", "v1", None)
    promote_run(store, "good")
    before = registry_bytes(store)
    write_gate(store, "bad", "v2", "v1", verdict="FAIL")
    result = run_job("promote", f"artifact_root={store.root}", f"model={MODEL}", "run_id=bad")
    assert result.returncode == 3, result.stderr[-2000:]
    assert "promote: error: gate verdict is FAIL" in result.stderr
    assert registry_bytes(store) == before


def test_promote_without_a_gate_report_is_bad_input(store):
    with pytest.raises(BadInputError, match="no gate report"):
        promote_run(store, "never-gated")
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
    write_gate(store, "after-corruption", "v1", None)
    with pytest.raises(BadInputError, match=expected):
        promote_run(store, "after-corruption")
    with pytest.raises(BadInputError, match=expected):
        registry.promote("v1", expected_previous=None, decision={})
    # The gate reads production first: it refuses too rather than gate against a guess.
    with pytest.raises(BadInputError, match=expected):
        run_gate(GateConfig(artifact_root=store.root, model=MODEL, run_id="after-corruption"))
    assert registry_bytes(store) == content


def test_corrupted_registry_promote_job_exits_2(store):
    content = CORRUPT["garbage"]
    store.write_bytes(layout.registry(MODEL), content)
    write_gate(store, "r", "v1", None)
    result = run_job("promote", f"artifact_root={store.root}", f"model={MODEL}", "run_id=r")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "is corrupted" in result.stderr and "never reset" in result.stderr
    assert registry_bytes(store) == content


def test_promoting_a_version_that_is_not_committed_is_refused(store, weights):
    write_gate(store, "ghost", "never-published", None)
    with pytest.raises(BadInputError, match="never-published is not committed"):
        promote_run(store, "ghost")
    assert registry_bytes(store) is None

    # A half-published version: weights and config written, COMMIT marker missing.
    spec = get_spec(MODEL)
    versions.publish(store, spec, "partial", weights, {})
    store.remove(f"{layout.model_version(MODEL, 'partial')}/COMMIT")
    assert store.exists(f"{layout.model_version(MODEL, 'partial')}/model.safetensors")
    write_gate(store, "half", "partial", None)
    with pytest.raises(BadInputError, match="partial is not committed"):
        promote_run(store, "half")
    assert registry_bytes(store) is None

    # With a production in place the refusal leaves it byte-identical.
    write_gate(store, "good", "v1", None)
    promote_run(store, "good")
    before = registry_bytes(store)
    write_gate(store, "half-again", "partial", "v1")
    with pytest.raises(BadInputError, match="is not committed"):
        promote_run(store, "half-again")
    with pytest.raises(BadInputError, match="is not committed"):
        Registry(store, MODEL).promote("nope", expected_previous="v1", decision={})
    assert registry_bytes(store) == before


def test_registry_history_records_each_promotion(store):
    production = None
    for i, version in enumerate(["v1", "v2", "v3", "v1"]):  # a rollback is a promotion too
        write_gate(store, f"run{i}", version, production)
        promote_run(store, f"run{i}")
        production = version
    doc = json.loads(registry_bytes(store))
    assert doc["model"] == MODEL
    assert doc["production"]["version"] == "v1"
    assert [h["version"] for h in doc["history"]] == ["v1", "v2", "v3", "v1"]
    assert [h["previous"] for h in doc["history"]] == [None, "v1", "v2", "v3"]
    assert doc["production"]["gate_report"].endswith("runs/tiny/run3/reports/gate.json")
