"""Promotion you can trust: the production pointer never moves to a damaged version,
a retried promotion of the same run succeeds, another run's later promotion is still a
conflict, and a person can roll production back to an earlier production version,
recorded with who and why.

The stores hold tiny model versions published in-process (``v1``..``v3``, ~8 MB of
weights each); the jobs run in-process (:func:`embedfresh.jobs.promote.promote`,
:func:`embedfresh.core.cli.run_job` for the exit codes), and two real processes prove
the command line end to end: a damaged promotion (exit 2, one line on stderr) and the
documented ``python -m embedfresh.jobs.rollback --config rollback.yaml``. The damage
and the streamed verification run on a local disk and on S3 (moto's server).
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
from embedfresh.core.config import (
    PromoteAnywayConfig,
    PromoteConfig,
    RollbackConfig,
    load_config,
)
from embedfresh.core.exit_codes import BadInputError, ConflictError, ExitCode
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.promote import promote
from embedfresh.jobs.promote_anyway import promote_anyway
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
    """A fresh local store with versions v1..v3 committed, nothing promoted."""
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


def promote_run(store: ArtifactStore, run_id: str) -> dict:
    return promote(PromoteConfig(artifact_root=store.root, model=MODEL, run_id=run_id))


def promoted(store: ArtifactStore, *steps: tuple[str, str]) -> None:
    """Promote each (run, version) in turn, each gated against the one before."""
    production = Registry(store, MODEL).production_version()
    for run_id, version in steps:
        write_gate(store, run_id, version, production)
        assert promote_run(store, run_id)["production"] == version
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
    return RollbackConfig(artifact_root=store.root, model=MODEL, to_version=to, **kw)


# -- a damaged version never becomes production ------------------------------------------


@pytest.mark.parametrize("how", ["truncated", "flipped-bit"])
def test_promote_refuses_a_damaged_version_production_unchanged(store, how):
    promoted(store, ("first", "v1"))
    now, listed = damage(store, "v2", how)
    write_gate(store, "second", "v2", "v1")
    before = registry_bytes(store)

    with pytest.raises(BadInputError) as exc:
        promote_run(store, "second")
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    message = str(exc.value)
    assert f"{store.url(weights_rel('v2'))} is damaged" in message, message
    assert "production stays 'v1'" in message, message
    if how == "truncated":
        assert f"has {now} bytes, COMMIT marker says {listed} (truncated)" in message, message
    else:
        assert "checksum does not match" in message and "same size" in message, message
    assert registry_bytes(store) == before
    assert Registry(store, MODEL).production_version() == "v1"


def test_damaged_promotion_exits_2_with_one_line_on_stderr(local):
    """End to end, as Airflow's worker runs it: exit 2 (no retry), one line, no summary."""
    import subprocess

    promoted(local, ("first", "v1"))
    damage(local, "v2", "flipped-bit")
    write_gate(local, "second", "v2", "v1")
    before = registry_bytes(local)
    cmd = [sys.executable, "-m", "embedfresh.jobs.promote"]
    cmd += ["--set", f"artifact_root={local.root}", "--set", "run_id=second"]
    result = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and result.stdout == ""
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("promote: error: ")]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0]
    assert f"{WEIGHTS} is damaged: {WEIGHTS} checksum does not match" in errors[0], errors[0]
    assert registry_bytes(local) == before


# -- idempotent for the run that promoted; a conflict for any other ----------------------


def test_promote_run_twice_exits_0_both_times(local, capsys, keep_logging):
    """An Airflow retry after a lost heartbeat: the first attempt moved the pointer."""
    promoted(local, ("first", "v1"))
    write_gate(local, "second", "v2", "v1")
    argv = ["--set", f"artifact_root={local.root}", "--set", "run_id=second"]

    assert run_in_process("promote", PromoteConfig, promote, argv) == ExitCode.OK
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["production"] == "v2" and first["previous"] == "v1"
    assert first["already"] is False and first["verified"]["files"] == 3
    after_first = registry_bytes(local)

    assert run_in_process("promote", PromoteConfig, promote, argv) == ExitCode.OK
    out, err = capsys.readouterr()
    again = json.loads(out.strip().splitlines()[-1])
    assert again == {**first, "already": True, "verified": None}
    assert "v2 is already production of tiny, promoted by this run (second)" in err
    assert registry_bytes(local) == after_first  # nothing written, not even a history line


def test_a_later_promote_by_another_run_is_still_a_conflict(local):
    promoted(local, ("first", "v1"), ("second", "v2"))
    before = registry_bytes(local)

    # "first" retried after "second" promoted: its version is no longer production.
    with pytest.raises(ConflictError, match=r"production is 'v2', expected None"):
        promote_run(local, "first")
    # Another run gated against v1 whose candidate happens to be production now.
    write_gate(local, "third", "v2", "v1")
    with pytest.raises(ConflictError, match="another run promoted first") as exc:
        promote_run(local, "third")
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert registry_bytes(local) == before
    assert promote_run(local, "second")["already"] is True  # the winner's retry is fine


def test_a_lost_swap_to_the_same_move_is_success(local, monkeypatch):
    """The conditional write loses to this very move (its answer lost, the retried PUT
    refused; or the run's other attempt won): that is success, not a conflict."""
    promoted(local, ("first", "v1"))
    write_gate(local, "second", "v2", "v1")
    real = local.write_if_match

    def done_meanwhile(rel, data, etag):
        real(rel, data, etag)
        raise ConflictError(f"{local.url(rel)} changed under us: a concurrent run won")

    monkeypatch.setattr(ArtifactStore, "write_if_match", lambda self, *a: done_meanwhile(*a))
    summary = promote(PromoteConfig(artifact_root=local.root, model=MODEL, run_id="second"))
    assert summary["production"] == "v2" and summary["already"] is True


# -- rollback ------------------------------------------------------------------------------


def test_rollback_is_recorded_in_history_with_who_and_why(local):
    promoted(local, ("first", "v1"), ("second", "v2"))
    summary = rollback(rollback_cfg(local, "v1"))
    assert summary["production"] == "v1" and summary["previous"] == "v2"
    assert summary["already"] is False and summary["verified"]["files"] == 3

    doc = json.loads(registry_bytes(local))
    entry = doc["history"][-1]
    assert [h["version"] for h in doc["history"]] == ["v1", "v2", "v1"]
    assert [h["action"] for h in doc["history"]] == ["promote", "promote", "rollback"]
    assert entry["who"] == "alice@laptop"
    assert entry["why"] == "v2 answers long queries worse (incident 42)"
    assert entry["previous"] == "v2"
    age = dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(entry["promoted_at"])
    assert dt.timedelta(0) <= age < dt.timedelta(minutes=5)
    assert doc["production"] == entry
    assert Registry(local, MODEL).former_production_versions() == ["v2"]

    # Rolling back to what is production: exit 0, says so, writes nothing.
    before = registry_bytes(local)
    again = rollback(rollback_cfg(local, "v1", who="bob@desk"))
    assert again["already"] is True and again["production"] == "v1"
    assert registry_bytes(local) == before
    # A promotion gated before the rollback is now a conflict, not a silent undo.
    write_gate(local, "third", "v3", "v2")
    with pytest.raises(ConflictError, match=r"production is 'v1', expected 'v2'"):
        promote_run(local, "third")


def test_rollback_to_a_version_never_production_is_refused(local):
    with pytest.raises(BadInputError, match="has no production version yet"):
        rollback(rollback_cfg(local, "v1"))
    assert registry_bytes(local) is None

    promoted(local, ("first", "v1"), ("second", "v2"))
    before = registry_bytes(local)
    for version in ("v3", "nope"):  # committed but never production; not a version
        with pytest.raises(BadInputError) as exc:
            rollback(rollback_cfg(local, version))
        assert exc.value.exit_code == ExitCode.BAD_INPUT
        assert f"cannot roll tiny back to {version}: it was never production" in str(exc.value)
        assert "former production versions, most recent first: v1)" in str(exc.value)
    assert registry_bytes(local) == before


def test_rollback_to_a_damaged_version_is_refused(local):
    promoted(local, ("first", "v1"), ("second", "v2"))
    damage(local, "v1", "flipped-bit")
    before = registry_bytes(local)
    with pytest.raises(BadInputError, match=r"cannot roll back to tiny version v1: .*damaged"):
        rollback(rollback_cfg(local, "v1"))
    assert registry_bytes(local) == before


def test_rollback_config_needs_a_reason_and_names_who(tmp_path):
    base = [f"artifact_root=file://{tmp_path}", "to_version=v1"]
    for reason in ([], ["reason="], ["reason=   "]):
        with pytest.raises(BadInputError, match=r"invalid RollbackConfig: reason"):
            load_config(RollbackConfig, None, [*base, *reason])
    cfg = load_config(RollbackConfig, None, [*base, "reason=bad"])
    assert cfg.who == f"{getpass.getuser()}@{socket.gethostname()}"
    with pytest.raises(BadInputError, match=r"invalid to_version '\.\./v1'"):
        load_config(RollbackConfig, None, [*base, "reason=x", "to_version=../v1"])


def test_rollback_command_with_a_config_file(local, tmp_path):
    """The documented command, in a real process; ``who`` defaults to user@host."""
    import subprocess

    promoted(local, ("first", "v1"), ("second", "v2"))
    config = tmp_path / "rollback.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            artifact_root: {local.root}
            model: tiny
            to_version: v1
            reason: v2 answers long queries worse (incident 42)
        """)
    )
    cmd = [sys.executable, "-m", "embedfresh.jobs.rollback", "--config", str(config)]
    result = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert result.returncode == ExitCode.OK, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    assert summary["production"] == "v1" and summary["who"] == who
    entry = json.loads(registry_bytes(local))["history"][-1]
    assert entry["action"] == "rollback" and entry["who"] == who and entry["previous"] == "v2"
    assert "production of tiny rolled back from v2 to v1" in result.stderr


# -- promote anyway: a person's override of the gate ------------------------------------


def anyway_cfg(store: ArtifactStore, version: str, **kw) -> PromoteAnywayConfig:
    kw.setdefault("reason", "FAIL is noise on the new eval set; accepted by the team")
    kw.setdefault("who", "bob")
    kw.setdefault("run_id", "override-1")
    return PromoteAnywayConfig(artifact_root=store.root, model=MODEL, version=version, **kw)


def test_promote_anyway_moves_production_and_records_who_and_why(store):
    """No gate report at all for v3: the override still moves production, verified, and
    the history says who, why and what it replaced; a retry of the same run writes
    nothing."""
    promoted(store, ("first", "v1"))
    summary = promote_anyway(anyway_cfg(store, "v3"))
    assert summary["production"] == "v3" and summary["previous"] == "v1"
    assert summary["already"] is False and summary["verified"]["files"] == 3
    assert summary["who"] == "bob"
    doc = json.loads(registry_bytes(store))
    entry = doc["history"][-1]
    assert entry["action"] == "promote_anyway" and entry["version"] == "v3"
    assert entry["who"] == "bob" and entry["why"].startswith("FAIL is noise")
    assert entry["previous"] == "v1" and entry["run_id"] == "override-1"
    assert dt.datetime.fromisoformat(entry["promoted_at"]).tzinfo is not None
    assert doc["production"]["action"] == "promote_anyway"

    after = registry_bytes(store)
    again = promote_anyway(anyway_cfg(store, "v3"))
    assert again["already"] is True and again["production"] == "v3"
    assert registry_bytes(store) == after


def test_promote_anyway_refuses_damaged_missing_and_current_versions(local):
    promoted(local, ("first", "v1"))
    damage(local, "v2", "truncated")
    before = registry_bytes(local)
    cases = {
        "v2": r"cannot promote tiny version v2: .*v2/model\.safetensors is damaged",
        "nope": r"cannot promote tiny version nope: .* is not committed",
        # production already, by another move: nothing to override
        "v1": r"cannot promote tiny version v1 anyway: it already is production",
    }
    for version, message in cases.items():
        with pytest.raises(BadInputError, match=message) as exc:
            promote_anyway(anyway_cfg(local, version))
        assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert registry_bytes(local) == before


def test_a_gated_promotion_after_an_override_is_a_conflict(local):
    """A run gated against v1 must not undo an override that made v3 production."""
    promoted(local, ("first", "v1"))
    write_gate(local, "second", "v2", "v1")
    promote_anyway(anyway_cfg(local, "v3"))
    with pytest.raises(ConflictError, match="production is 'v3', expected 'v1'"):
        promote_run(local, "second")
    assert Registry(local, MODEL).production_version() == "v3"
    # and the overridden-to version counts as former production for a rollback
    rollback(rollback_cfg(local, "v1"))
    assert Registry(local, MODEL).former_production_versions() == ["v3"]


def test_promote_anyway_config_needs_a_reason(tmp_path):
    base = [f"artifact_root=file://{tmp_path}", "version=v1"]
    for reason in ([], ["reason="], ["reason=  "]):
        with pytest.raises(BadInputError, match=r"invalid PromoteAnywayConfig: reason"):
            load_config(PromoteAnywayConfig, None, [*base, *reason])


def test_promote_anyway_command_with_a_config_file(local, tmp_path):
    """The documented command, in a real process: exit 0, a warning in the log."""
    import subprocess

    promoted(local, ("first", "v1"))
    config = tmp_path / "promote_anyway.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            artifact_root: {local.root}
            model: tiny
            version: v2
            reason: the gate's FAIL is a known eval-set artefact (ticket 7)
        """)
    )
    cmd = [sys.executable, "-m", "embedfresh.jobs.promote_anyway", "--config", str(config)]
    result = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert result.returncode == ExitCode.OK, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["production"] == "v2" and summary["previous"] == "v1"
    assert "moved from v1 to v2 WITHOUT a gate's PASS" in result.stderr


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
    summary = promote_run(store, "first")
    assert summary["verified"]["files"] == 3 and summary["verified"]["bytes"] > size

    assert not [r for r in whole if r.endswith((WEIGHTS, "tokenizer.json"))], whole
    weights_reads = reads[weights_rel("v1")]
    assert sum(weights_reads) == size and len(weights_reads) >= size // chunk

    # Truncated: refused on its size, without a byte of it read.
    damage(store, "v2", "truncated")
    write_gate(store, "second", "v2", "v1")
    reads.clear()
    with pytest.raises(BadInputError, match="truncated"):
        promote_run(store, "second")
    assert weights_rel("v2") not in reads
    assert Registry(store, MODEL).production_version() == "v1"
