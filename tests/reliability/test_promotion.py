"""Releasing you can trust: the production pointer never moves to a damaged version,
a retried release of the same run succeeds, another run's later release is still a
conflict, and a person can roll production back to an earlier release retention keeps,
recorded with who and why (a release past retention is refused, naming those kept).

The stores hold tiny model versions published in-process (``v1``..``v3``, ~8 MB of
weights each), released without corpora (``corpora=[]``: no vector index needed); the
jobs run in-process (:func:`embedfresh.jobs.release.release`,
:func:`embedfresh.core.cli.run_job` for the exit codes), and three real processes prove
the command line end to end: a damaged release (exit 2, one line on stderr), the
documented ``python -m embedfresh.jobs.rollback --config rollback.yaml`` and a "promote
anyway" release from a config file. The damage and the streamed verification run on a
local disk and on S3 (moto's server).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import itertools
import json
import logging
import socket
import sys
import textwrap

import pytest

from embedfresh.core import layout, markers
from embedfresh.core.cli import run_job as run_in_process
from embedfresh.core.config import ReleaseConfig, RollbackConfig, load_config
from embedfresh.core.exit_codes import BadInputError, ConflictError, ExitCode
from embedfresh.core.registry import PROMOTE_ANYWAY, Registry
from embedfresh.core.releases import (
    kept_releases,
    live_release,
    read_release,
    release_doc,
    release_history,
    write_release,
)
from embedfresh.core.settings import KEEP_RELEASES_ENV
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.release import release
from embedfresh.jobs.rollback import rollback
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import ROOT, job_env

MODEL = "tiny"
WEIGHTS = "model.safetensors"
_buckets = itertools.count()


@pytest.fixture(scope="module")
def weights() -> dict:
    """One set of tiny weights, published under several version names."""
    return cpu_state_dict(versions.build_model(get_spec(MODEL), seed=0))


def _publish_all(store: ArtifactStore, weights: dict) -> ArtifactStore:
    for name in ("v1", "v2", "v3"):
        versions.publish(store, get_spec(MODEL), name, weights, {})
    return store


@pytest.fixture
def local(tmp_path, weights) -> ArtifactStore:
    """A fresh local store with versions v1..v3 committed, nothing released."""
    return _publish_all(ArtifactStore(f"file://{tmp_path / 'root'}"), weights)


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path, weights) -> ArtifactStore:
    """The same, on a local disk or in a fresh bucket of moto's S3 server."""
    if request.param == "file":
        return _publish_all(ArtifactStore(f"file://{tmp_path / 'root'}"), weights)
    import boto3

    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"promotion-{next(_buckets)}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return _publish_all(ArtifactStore(f"s3://{bucket}/prod"), weights)


@pytest.fixture
def keep_logging():
    """:func:`run_in_process` points the root logger at this test's captured stderr."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def write_gate(store: ArtifactStore, run_id: str, candidate: str, production: str | None):
    """A PASS gate report, as the gate job writes it."""
    store.write_json(
        layout.report(MODEL, run_id, "gate"),
        {
            "verdict": "PASS",
            "mode": "no_regression",
            "candidate": {"version": candidate},
            "reference": {"version": production or "baseline"},
            "production_at_decision": production,
            "metrics": [{"metric": "accuracy", "d": 0.0}],
        },
    )


def release_cfg(store: ArtifactStore, run_id: str, version: str, **kw) -> ReleaseConfig:
    return ReleaseConfig(
        artifact_root=store.root, model=MODEL, run_id=run_id, version=version, corpora=[], **kw
    )


def release_run(store: ArtifactStore, run_id: str, version: str) -> dict:
    """The release job for the run (gated on ``version``), without corpora."""
    return release(release_cfg(store, run_id, version))


def released(store: ArtifactStore, *steps: tuple[str, str]) -> None:
    """Release each (run, version) in turn, each gated against the one before."""
    production = Registry(store, MODEL).production_version()
    for run_id, version in steps:
        write_gate(store, run_id, version, production)
        summary = release_run(store, run_id, version)
        assert (summary["production"], summary["release"]) == (version, run_id)
        production = version


def registry_bytes(store: ArtifactStore) -> bytes | None:
    rel = layout.registry(MODEL)
    return store.read_bytes(rel) if store.exists(rel) else None


def weights_rel(version: str) -> str:
    return f"{layout.model_version(MODEL, version)}/{WEIGHTS}"


def damage(store: ArtifactStore, version: str, how: str) -> tuple[int, int]:
    """Damage the version's weights after its COMMIT: cut to half, or flip one bit.
    Returns (size now, size in the marker)."""
    data = bytearray(store.read_bytes(weights_rel(version)))
    size = len(data)
    if how == "truncated":
        data = data[: size // 2]
    else:
        data[size // 2] ^= 0x01  # same size, one bit different
    store.write_bytes(weights_rel(version), bytes(data))
    return len(data), size


def rollback_cfg(store: ArtifactStore, to: str, **kw) -> RollbackConfig:
    kw.setdefault("reason", "v2 answers long queries worse (incident 42)")
    kw.setdefault("who", "alice@laptop")
    return RollbackConfig(artifact_root=store.root, model=MODEL, to_release=to, **kw)


# -- a damaged version never becomes production ------------------------------------------


@pytest.mark.parametrize("how", ["truncated", "flipped-bit"])
def test_release_refuses_a_damaged_version_production_unchanged(store, how):
    released(store, ("first", "v1"))
    now, listed = damage(store, "v2", how)
    write_gate(store, "second", "v2", "v1")
    before = registry_bytes(store)

    with pytest.raises(BadInputError) as exc:
        release_run(store, "second", "v2")
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    message = str(exc.value)
    assert message.startswith("cannot promote tiny version v2: "), message
    assert f"{store.url(weights_rel('v2'))} is damaged" in message, message
    assert "production stays 'v1'" in message, message
    if how == "truncated":
        assert f"has {now} bytes, COMMIT marker says {listed} (truncated)" in message, message
    else:
        assert "checksum does not match" in message and "same size" in message, message
    assert registry_bytes(store) == before
    assert Registry(store, MODEL).production_version() == "v1"
    assert live_release(store, MODEL).release == "first"


def test_damaged_release_exits_2_with_one_line_on_stderr(local):
    """End to end, as Airflow's worker runs it: exit 2 (no retry), one line, no summary."""
    import subprocess

    released(local, ("first", "v1"))
    damage(local, "v2", "flipped-bit")
    write_gate(local, "second", "v2", "v1")
    before = registry_bytes(local)
    cmd = [sys.executable, "-m", "embedfresh.jobs.release"]
    cmd += ["--set", f"artifact_root={local.root}", "--set", "run_id=second"]
    cmd += ["--set", "version=v2", "--set", "corpora=[]"]
    result = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and result.stdout == ""
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("release: error: ")]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0]
    assert f"{WEIGHTS} is damaged: {WEIGHTS} checksum does not match" in errors[0], errors[0]
    assert registry_bytes(local) == before


# -- idempotent for the run that released; a conflict for any other ----------------------


def test_release_run_twice_exits_0_both_times(local, capsys, keep_logging):
    """An Airflow retry after a lost heartbeat: the first attempt moved the pointer."""
    released(local, ("first", "v1"))
    write_gate(local, "second", "v2", "v1")
    argv = ["--set", f"artifact_root={local.root}", "--set", "run_id=second"]
    argv += ["--set", "version=v2", "--set", "corpora=[]"]

    assert run_in_process("release", ReleaseConfig, release, argv) == ExitCode.OK
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["production"] == "v2" and first["previous"] == "v1"
    assert first["release"] == "second" and first["previous_release"] == "first"
    assert first["already"] is False and first["verified"]["files"] == 3
    after_first = registry_bytes(local)
    release_doc = local.read_bytes(layout.release(MODEL, "second"))

    assert run_in_process("release", ReleaseConfig, release, argv) == ExitCode.OK
    out, err = capsys.readouterr()
    again = json.loads(out.strip().splitlines()[-1])
    assert again == {**first, "already": True, "verified": None}
    assert "release second is live already (by this run): nothing to move" in err
    assert registry_bytes(local) == after_first  # nothing written, not even a history line
    assert local.read_bytes(layout.release(MODEL, "second")) == release_doc


def test_a_later_release_by_another_run_is_still_a_conflict(local):
    released(local, ("first", "v1"), ("second", "v2"))
    before = registry_bytes(local)

    # "first" retried after "second" released: its release is no longer the live one.
    with pytest.raises(ConflictError, match=r"production version is 'v2', expected None"):
        release_run(local, "first", "v1")
    # Another run gated against v1 whose candidate happens to be production now.
    write_gate(local, "third", "v2", "v1")
    with pytest.raises(ConflictError, match="another run released first") as exc:
        release_run(local, "third", "v2")
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert registry_bytes(local) == before
    assert release_run(local, "second", "v2")["already"] is True  # the winner's retry is fine


def test_a_lost_swap_to_the_same_move_is_success(local, monkeypatch):
    """The conditional write of the registry loses to this very move (its answer lost, the
    retried PUT refused; or the run's other attempt won): success, not a conflict."""
    released(local, ("first", "v1"))
    write_gate(local, "second", "v2", "v1")
    real = ArtifactStore.write_if_match
    lost = []

    def done_meanwhile(self, rel, data, etag):
        real(self, rel, data, etag)
        if rel == layout.registry(MODEL):
            lost.append(rel)
            raise ConflictError(f"{self.url(rel)} changed under us: a concurrent run won")

    monkeypatch.setattr(ArtifactStore, "write_if_match", done_meanwhile)
    summary = release_run(local, "second", "v2")
    assert lost == [layout.registry(MODEL)]
    assert summary["production"] == "v2" and summary["already"] is True
    assert live_release(local, MODEL).release == "second"


# -- rollback ------------------------------------------------------------------------------


def test_rollback_is_recorded_in_history_with_who_and_why(local):
    released(local, ("first", "v1"), ("second", "v2"))
    summary = rollback(rollback_cfg(local, "first"))
    assert summary["production"] == "v1" and summary["previous"] == "v2"
    assert summary["release"] == "first" and summary["previous_release"] == "second"
    assert summary["already"] is False and summary["verified"]["files"] == 3
    assert summary["release_url"] == local.url(layout.release(MODEL, "first"))

    doc = json.loads(registry_bytes(local))
    entry = doc["history"][-1]
    assert [h["version"] for h in doc["history"]] == ["v1", "v2", "v1"]
    assert [h["release"] for h in doc["history"]] == ["first", "second", "first"]
    assert [h["action"] for h in doc["history"]] == ["promote", "promote", "rollback"]
    assert entry["who"] == "alice@laptop"
    assert entry["why"] == "v2 answers long queries worse (incident 42)"
    assert entry["previous"] == "v2" and entry["previous_release"] == "second"
    age = dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(entry["promoted_at"])
    assert dt.timedelta(0) <= age < dt.timedelta(minutes=5)
    assert doc["production"] == entry
    assert release_history(doc) == ["first", "second"]
    assert live_release(local, MODEL).release == "first"

    # Rolling back to the live release: exit 0, says so, writes nothing.
    before = registry_bytes(local)
    again = rollback(rollback_cfg(local, "first", who="bob@desk"))
    assert again["already"] is True and again["production"] == "v1"
    assert registry_bytes(local) == before
    # A release gated before the rollback is now a conflict, not a silent undo.
    write_gate(local, "third", "v3", "v2")
    with pytest.raises(ConflictError, match=r"production version is 'v1', expected 'v2'"):
        release_run(local, "third", "v3")


def test_rollback_to_a_release_never_live_is_refused(local):
    with pytest.raises(BadInputError, match="has no production yet, so there is nothing"):
        rollback(rollback_cfg(local, "first"))
    assert registry_bytes(local) is None

    released(local, ("first", "v1"), ("second", "v2"))
    # A release gated against a production that moved is refused before its document is
    # written; a document that exists but never went live (written by hand, or by an
    # older embedfresh whose move lost) is no rollback target either.
    write_gate(local, "stale", "v3", "v1")
    with pytest.raises(ConflictError):
        release_run(local, "stale", "v3")
    assert not local.exists(layout.release(MODEL, "stale"))
    write_release(
        local,
        release_doc(
            model=MODEL, release="stale", version="v3", version_url="", run_id="stale",
            action="promote", corpora={}, created_at="2026-11-28T00:00:00+00:00",
        ),
    )  # fmt: skip
    before = registry_bytes(local)
    for target in ("stale", "v3", "nope"):  # never live; a version, not a release; nothing
        with pytest.raises(BadInputError) as exc:
            rollback(rollback_cfg(local, target))
        assert exc.value.exit_code == ExitCode.BAD_INPUT
        message = str(exc.value)
        assert f"cannot roll tiny back to release {target}: retention keeps" in message
        assert "live 'second'; kept before it, most recent first: first)" in message, message
    assert registry_bytes(local) == before


def test_rollback_past_retention_is_refused_naming_the_kept_ones(local, monkeypatch):
    """Three releases, two kept: the oldest is out of reach; the message names the live
    one and the one kept before it. With three kept it is allowed."""
    released(local, ("r1", "v1"), ("r2", "v2"), ("r3", "v3"))
    doc, _ = Registry(local, MODEL).read()
    assert kept_releases(doc, 2) == ["r3", "r2"]
    before = registry_bytes(local)

    monkeypatch.setenv(KEEP_RELEASES_ENV, "2")  # the default of keep_releases
    cfg = rollback_cfg(local, "r1")
    assert cfg.keep_releases == 2
    with pytest.raises(BadInputError) as exc:
        rollback(cfg)
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    message = str(exc.value)
    assert "cannot roll tiny back to release r1: retention keeps the last 2 releases" in message
    assert "live 'r3'; kept before it, most recent first: r2)" in message, message
    assert registry_bytes(local) == before

    # The kept one is reachable at keep 2, and the oldest at keep 3.
    assert rollback(rollback_cfg(local, "r2", keep_releases=2))["release"] == "r2"
    assert rollback(rollback_cfg(local, "r1", keep_releases=3))["release"] == "r1"
    assert live_release(local, MODEL).version == "v1"


def test_rollback_to_a_damaged_version_is_refused(local):
    released(local, ("first", "v1"), ("second", "v2"))
    damage(local, "v1", "flipped-bit")
    before = registry_bytes(local)
    with pytest.raises(BadInputError, match=r"cannot roll back to tiny version v1: .*damaged"):
        rollback(rollback_cfg(local, "first"))
    assert registry_bytes(local) == before


def test_rollback_config_needs_a_reason_and_names_who(tmp_path):
    base = [f"artifact_root=file://{tmp_path}", "to_release=r1"]
    for reason in ([], ["reason="], ["reason=   "]):
        with pytest.raises(BadInputError, match=r"invalid RollbackConfig: reason"):
            load_config(RollbackConfig, None, [*base, *reason])
    cfg = load_config(RollbackConfig, None, [*base, "reason=bad"])
    assert cfg.who == f"{getpass.getuser()}@{socket.gethostname()}"
    with pytest.raises(BadInputError, match=r"invalid to_release '\.\./r1'"):
        load_config(RollbackConfig, None, [*base, "reason=x", "to_release=../r1"])
    with pytest.raises(BadInputError, match=r"invalid RollbackConfig: to_release: Field required"):
        load_config(RollbackConfig, None, [f"artifact_root=file://{tmp_path}", "reason=x"])


def test_rollback_command_with_a_config_file(local, tmp_path):
    """The documented command, in a real process; ``who`` defaults to user@host."""
    import subprocess

    released(local, ("first", "v1"), ("second", "v2"))
    config = tmp_path / "rollback.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            artifact_root: {local.root}
            model: tiny
            to_release: first
            reason: v2 answers long queries worse (incident 42)
        """)
    )
    cmd = [sys.executable, "-m", "embedfresh.jobs.rollback", "--config", str(config)]
    result = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert result.returncode == ExitCode.OK, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    assert summary["production"] == "v1" and summary["release"] == "first"
    assert summary["who"] == who
    entry = json.loads(registry_bytes(local))["history"][-1]
    assert entry["action"] == "rollback" and entry["who"] == who and entry["previous"] == "v2"
    assert entry["release"] == "first" and entry["previous_release"] == "second"
    assert "live release of tiny rolled back from second to first (version v1)" in result.stderr


# -- promote anyway: a person's override of the gate ------------------------------------


def anyway_cfg(store: ArtifactStore, version: str, **kw) -> ReleaseConfig:
    kw.setdefault("reason", "FAIL is noise on the new eval set; accepted by the team")
    kw.setdefault("who", "bob")
    kw.setdefault("run_id", "override-1")
    return ReleaseConfig(
        artifact_root=store.root,
        model=MODEL,
        version=version,
        corpora=[],
        action="promote_anyway",
        **kw,
    )


def test_promote_anyway_moves_production_and_records_who_and_why(store):
    """No gate report at all for v3: the override still moves production, verified, and
    the history and the release say who, why and what it replaced; a retry of the same
    run writes nothing."""
    released(store, ("first", "v1"))
    summary = release(anyway_cfg(store, "v3"))
    assert summary["production"] == "v3" and summary["previous"] == "v1"
    assert summary["release"] == "override-1" and summary["previous_release"] == "first"
    assert summary["already"] is False and summary["verified"]["files"] == 3
    assert summary["action"] == "promote_anyway"
    doc = json.loads(registry_bytes(store))
    entry = doc["history"][-1]
    assert entry["action"] == "promote_anyway" and entry["version"] == "v3"
    assert entry["who"] == "bob" and entry["why"].startswith("FAIL is noise")
    assert entry["previous"] == "v1" and entry["run_id"] == "override-1"
    assert entry["release"] == "override-1" and entry["previous_release"] == "first"
    assert dt.datetime.fromisoformat(entry["promoted_at"]).tzinfo is not None
    assert doc["production"]["action"] == "promote_anyway"
    made = read_release(store, MODEL, "override-1")
    assert made.doc["action"] == "promote_anyway" and made.doc["gate"] is None
    assert made.doc["who"] == "bob" and made.doc["why"].startswith("FAIL is noise")

    after = registry_bytes(store)
    again = release(anyway_cfg(store, "v3"))
    assert again["already"] is True and again["production"] == "v3"
    assert registry_bytes(store) == after


def test_promote_anyway_refuses_damaged_missing_and_live_releases(local):
    released(local, ("first", "v1"))
    damage(local, "v2", "truncated")
    before = registry_bytes(local)
    cases = {
        "v2": r"cannot promote tiny version v2: .*v2/model\.safetensors is damaged",
        "nope": r"cannot promote tiny version nope: .* is not committed",
    }
    for version, message in cases.items():
        with pytest.raises(BadInputError, match=message) as exc:
            release(anyway_cfg(local, version, run_id=f"override-{version}"))
        assert exc.value.exit_code == ExitCode.BAD_INPUT
    # The live release itself, promoted anyway: nothing to override.
    live = read_release(local, MODEL, "first")
    with pytest.raises(BadInputError, match="cannot promote tiny release first anyway: it is live"):
        Registry(local, MODEL).release(
            live,
            action=PROMOTE_ANYWAY,
            details={"run_id": "override-live", "who": "bob", "why": "again"},
        )
    # Through the job, under the live release's own run id: refused before anything
    # is written.
    with pytest.raises(BadInputError, match="cannot promote tiny release first anyway: it is live"):
        release(anyway_cfg(local, "v1", run_id="first"))
    assert registry_bytes(local) == before


def test_a_gated_release_after_an_override_is_a_conflict(local):
    """A run gated against v1 must not undo an override that made v3 production."""
    released(local, ("first", "v1"))
    write_gate(local, "second", "v2", "v1")
    release(anyway_cfg(local, "v3"))
    with pytest.raises(ConflictError, match="production version is 'v3', expected 'v1'"):
        release_run(local, "second", "v2")
    assert Registry(local, MODEL).production_version() == "v3"
    # and the override's release is kept for a rollback back to it
    rollback(rollback_cfg(local, "first"))
    doc, _ = Registry(local, MODEL).read()
    assert kept_releases(doc, 3) == ["first", "override-1"]
    assert rollback(rollback_cfg(local, "override-1"))["production"] == "v3"


def test_promote_anyway_config_needs_a_reason(tmp_path):
    base = [f"artifact_root=file://{tmp_path}", "version=v1", "action=promote_anyway"]
    for reason in ([], ["reason="], ["reason=  "]):
        with pytest.raises(
            BadInputError, match=r"invalid ReleaseConfig: .*promote_anyway needs a reason"
        ):
            load_config(ReleaseConfig, None, [*base, *reason])
    # and a gated release takes none: its reason is its gate
    with pytest.raises(BadInputError, match=r"reason is for action=promote_anyway"):
        load_config(ReleaseConfig, None, [f"artifact_root=file://{tmp_path}", "reason=x"])


def test_promote_anyway_command_with_a_config_file(local, tmp_path):
    """The documented command, in a real process: exit 0, a warning in the log."""
    import subprocess

    released(local, ("first", "v1"))
    config = tmp_path / "promote_anyway.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            artifact_root: {local.root}
            model: tiny
            run_id: override-7
            version: v2
            corpora: []
            action: promote_anyway
            reason: the gate's FAIL is a known eval-set artefact (ticket 7)
        """)
    )
    cmd = [sys.executable, "-m", "embedfresh.jobs.release", "--config", str(config)]
    result = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert result.returncode == ExitCode.OK, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["production"] == "v2" and summary["previous"] == "v1"
    assert summary["release"] == "override-7"
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    assert (
        f"live release of tiny moved to override-7 (version v2) WITHOUT a gate's PASS, by {who}"
        in result.stderr
    ), result.stderr[-3000:]
    assert json.loads(registry_bytes(local))["production"]["who"] == who


# -- verification is streamed --------------------------------------------------------------


def test_verification_streams_every_file_in_chunks(store, monkeypatch):
    """Never a whole object in memory: no ``read_bytes`` of a version's weights, only
    ``open_read`` reads of at most one chunk; a truncated object is not even opened."""
    chunk = 256 * 1024
    monkeypatch.setattr(markers, "CHUNK_BYTES", chunk)
    whole: list[str] = []
    reads: dict[str, list[int]] = {}
    real_read_bytes, real_open_read = ArtifactStore.read_bytes, ArtifactStore.open_read

    def read_bytes(self, rel):
        whole.append(rel)
        return real_read_bytes(self, rel)

    @contextlib.contextmanager
    def open_read(self, rel):
        with real_open_read(self, rel) as f:
            sizes = reads.setdefault(rel, [])

            class Counting:
                def read(self, n=-1):
                    data = f.read(n)
                    sizes.append(len(data))
                    assert n != -1 and len(data) <= chunk, "a read of the whole object"
                    return data

            yield Counting()

    size = store.size(weights_rel("v1"))
    assert size > 8 * chunk
    monkeypatch.setattr(ArtifactStore, "read_bytes", read_bytes)
    monkeypatch.setattr(ArtifactStore, "open_read", open_read)
    write_gate(store, "first", "v1", None)
    summary = release_run(store, "first", "v1")
    assert summary["verified"]["files"] == 3 and summary["verified"]["bytes"] > size

    assert not [r for r in whole if r.endswith((WEIGHTS, "tokenizer.json"))], whole
    weights_reads = reads[weights_rel("v1")]
    assert sum(weights_reads) == size and len(weights_reads) >= size // chunk

    # Truncated: refused on its size, without a byte of it read.
    damage(store, "v2", "truncated")
    write_gate(store, "second", "v2", "v1")
    reads.clear()
    with pytest.raises(BadInputError, match="truncated"):
        release_run(store, "second", "v2")
    assert weights_rel("v2") not in reads
    assert Registry(store, MODEL).production_version() == "v1"
