"""The artifact store on a local disk and on S3 (moto's server on 127.0.0.1): whole
objects, listings, removal, path safety, compare-and-swap, commit markers, and the
retries of S3 faults (through the test-only fault proxy)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import stat
import subprocess
import sys

import pytest

from embedfresh.core import markers
from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.storage import ArtifactStore
from tests.reliability.test_transient_exit import raised_from

_buckets = itertools.count()


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path) -> ArtifactStore:
    """An empty store under a fresh root, on a local disk or in a fresh S3 bucket."""
    if request.param == "file":
        return ArtifactStore(f"file://{tmp_path / 'root'}")
    import boto3

    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"storage-{next(_buckets)}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return ArtifactStore(f"s3://{bucket}/some/prefix")


def test_bytes_and_json_round_trip(store):
    payload = bytes(range(256)) * 3
    store.write_bytes("a/b/blob.bin", payload)
    assert store.read_bytes("a/b/blob.bin") == payload
    assert store.size("a/b/blob.bin") == len(payload)

    doc = {"step": 7, "loss": [0.5, 0.25], "name": "tiny", "nested": {"ok": True}}
    store.write_json("reports/train.json", doc)
    assert store.read_json("reports/train.json") == doc

    store.write_bytes("a/b/blob.bin", b"replaced")  # a rewrite replaces the whole object
    assert store.read_bytes("a/b/blob.bin") == b"replaced"


def test_read_json_of_garbage_is_bad_input(store):
    store.write_bytes("broken.json", b"{not json")
    with pytest.raises(BadInputError, match="not valid JSON"):
        store.read_json("broken.json")


def test_write_json_refuses_nan(store):
    with pytest.raises(ValueError):
        store.write_json("nan.json", {"loss": float("nan")})
    assert not store.exists("nan.json")


def test_missing_object(store):
    assert not store.exists("nope/x.json")
    assert store.etag("nope/x.json") is None
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nope/x.json")


def test_listdir_names_direct_children_only(store):
    for rel in ("d/one.txt", "d/two.txt", "d/sub/deep.txt", "d/sub/deeper/x.txt", "other.txt"):
        store.write_bytes(rel, rel.encode())
    assert store.listdir("d") == ["one.txt", "sub", "two.txt"]
    assert store.listdir("d/sub") == ["deep.txt", "deeper"]
    assert store.listdir("") == ["d", "other.txt"]
    assert store.listdir("does/not/exist") == []


def test_exists_for_objects_and_directories(store):
    store.write_bytes("x/y/z.bin", b"1")
    assert store.exists("x/y/z.bin")
    assert store.exists("x/y")
    assert store.exists("x")
    assert not store.exists("x/y/z.bi")
    assert not store.exists("x/q")


def test_remove_recursive(store):
    for rel in ("ck/step-1/a", "ck/step-1/b", "ck/step-1/sub/c", "ck/step-2/a"):
        store.write_bytes(rel, b"data")
    store.remove("ck/step-1", recursive=True)
    assert not store.exists("ck/step-1/a")
    assert not store.exists("ck/step-1/sub/c")
    assert store.listdir("ck") == ["step-2"]
    assert store.read_bytes("ck/step-2/a") == b"data"

    store.remove("ck/step-2/a")  # a single object
    assert not store.exists("ck/step-2/a")
    store.remove("ck/never-existed", recursive=True)  # removing nothing is not an error


@pytest.mark.parametrize(
    "rel",
    ["../escape.txt", "a/../../escape.txt", "a/./b.txt", "runs/../../../etc/passwd"],
)
def test_path_traversal_is_rejected(store, rel):
    with pytest.raises(BadInputError, match=r"'\.\.'"):
        store.write_bytes(rel, b"x")
    with pytest.raises(BadInputError):
        store.read_bytes(rel)
    with pytest.raises(BadInputError):
        store.exists(rel)
    with pytest.raises(BadInputError):
        store.remove(rel, recursive=True)


def test_path_traversal_writes_nothing_outside_the_root(tmp_path):
    store = ArtifactStore(f"file://{tmp_path / 'root'}")
    with pytest.raises(BadInputError):
        store.write_bytes("../outside.txt", b"x")
    assert not (tmp_path / "outside.txt").exists()


@pytest.mark.parametrize(
    "root, words",
    [
        ("gs://bucket/prefix", "unsupported scheme 'gs'"),
        ("http://example.com/artifacts", "unsupported scheme 'http'"),
        ("hdfs:///data", "unsupported scheme 'hdfs'"),
        ("s3:///no-bucket", "names no bucket"),
    ],
)
def test_unsupported_root_is_rejected(root, words):
    with pytest.raises(BadInputError, match=words):
        ArtifactStore(root)


def test_plain_local_path_is_a_file_root(tmp_path):
    store = ArtifactStore(str(tmp_path / "plain"))
    store.write_bytes("k/v", b"1")
    assert store.root == f"file://{tmp_path / 'plain'}"
    assert (tmp_path / "plain" / "k" / "v").read_bytes() == b"1"


def test_write_if_match_create_if_absent_succeeds_once(store):
    store.write_if_match("models/tiny/registry.json", b'{"v": 1}', None)
    assert store.read_bytes("models/tiny/registry.json") == b'{"v": 1}'
    with pytest.raises(ConflictError, match="changed under us"):
        store.write_if_match("models/tiny/registry.json", b'{"v": "other"}', None)
    assert store.read_bytes("models/tiny/registry.json") == b'{"v": 1}'


def test_write_if_match_stale_etag_conflicts(store):
    store.write_if_match("registry.json", b"first", None)
    stale = store.etag("registry.json")
    store.write_if_match("registry.json", b"second", stale)
    assert store.etag("registry.json") != stale
    with pytest.raises(ConflictError):
        store.write_if_match("registry.json", b"third", stale)
    assert store.read_bytes("registry.json") == b"second"


def test_write_if_match_correct_etag_succeeds(store):
    store.write_bytes("registry.json", b"v1")
    tag = store.etag("registry.json")
    assert tag
    store.write_if_match("registry.json", b"v2", tag)
    assert store.read_bytes("registry.json") == b"v2"
    tag2 = store.etag("registry.json")
    store.write_if_match("registry.json", b"v3", tag2)
    assert store.read_bytes("registry.json") == b"v3"


def test_write_if_match_with_an_etag_on_a_missing_object_conflicts(store):
    with pytest.raises(ConflictError):
        store.write_if_match("absent.json", b"x", "0123456789abcdef")
    assert not store.exists("absent.json")


def _committed_dir(store: ArtifactStore) -> dict[str, bytes]:
    files = {"model.safetensors": bytes(range(200)), "meta.json": json.dumps({"s": 1}).encode()}
    for name, data in files.items():
        store.write_bytes(f"ck/{name}", data)
    markers.write_marker(store, "ck", files, meta={"step": 1})
    return files


def test_marker_verifies_an_intact_directory(store):
    _committed_dir(store)
    assert markers.verify(store, "ck").ok
    marker = markers.read_marker(store, "ck")
    assert marker["step"] == 1
    assert set(marker["files"]) == {"model.safetensors", "meta.json"}


def test_marker_detects_one_changed_byte(store):
    files = _committed_dir(store)
    data = bytearray(files["model.safetensors"])
    data[100] ^= 0x01  # same size, one bit different
    store.write_bytes("ck/model.safetensors", bytes(data))
    check = markers.verify(store, "ck")
    assert not check.ok
    assert "model.safetensors" in check.reason and "checksum" in check.reason


def test_marker_detects_truncation_and_missing_files(store):
    files = _committed_dir(store)
    store.write_bytes("ck/model.safetensors", files["model.safetensors"][:50])
    check = markers.verify(store, "ck")
    assert not check.ok and "50 bytes" in check.reason

    store.write_bytes("ck/model.safetensors", files["model.safetensors"])
    assert markers.verify(store, "ck").ok
    store.remove("ck/meta.json")
    check = markers.verify(store, "ck")
    assert not check.ok and "meta.json is missing" in check.reason


def test_directory_without_marker_or_with_a_garbage_marker_is_not_committed(store):
    store.write_bytes("ck/model.safetensors", b"weights")
    assert markers.read_marker(store, "ck") is None
    assert not markers.verify(store, "ck").ok
    store.write_bytes(f"ck/{markers.COMMIT}", b"\x00\x01 not json")
    assert markers.read_marker(store, "ck") is None
    assert not markers.verify(store, "ck").ok


def test_concurrent_create_if_absent_has_exactly_one_winner(store):
    from concurrent.futures import ThreadPoolExecutor

    def attempt(i: int) -> str:
        try:
            store.write_if_match("registry.json", f"writer {i}".encode(), None)
        except ConflictError:
            return "lost"
        return f"writer {i}"

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(attempt, range(8)))
    winners = [o for o in outcomes if o != "lost"]
    assert len(winners) == 1, outcomes
    assert store.read_bytes("registry.json") == winners[0].encode()


# -- retries: botocore's standard mode, bounded, and the errors worth retrying -------------


def test_s3_retry_config_defaults_and_environment(monkeypatch):
    from embedfresh.core.storage import S3_MAX_ATTEMPTS, s3_retry_config

    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    assert s3_retry_config() == {"mode": "standard", "total_max_attempts": S3_MAX_ATTEMPTS}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    assert s3_retry_config() == {"mode": "adaptive", "total_max_attempts": 3}


@pytest.mark.parametrize("value", ["three", "0"])
def test_s3_retry_config_refuses_a_bad_attempt_count(monkeypatch, value):
    from embedfresh.core.storage import s3_retry_config

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", value)
    with pytest.raises(BadInputError, match="AWS_MAX_ATTEMPTS"):
        s3_retry_config()


def test_the_s3_client_carries_the_retry_config(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "4")
    store = ArtifactStore("s3://any-bucket/prefix")
    assert store.fs.config_kwargs["retries"] == {"mode": "standard", "total_max_attempts": 4}
    explicit = ArtifactStore(
        "s3://any-bucket/prefix", {"config_kwargs": {"retries": {"max_attempts": 1}}}
    )
    assert explicit.fs.config_kwargs["retries"] == {"max_attempts": 1}


class _ServiceError(Exception):
    """Shaped like botocore's ClientError: a ``response`` dict."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}, "Error": {"Code": code}}


@pytest.mark.parametrize(
    "exc, transient",
    [
        (_ServiceError(503, "SlowDown"), True),
        (_ServiceError(500, "InternalError"), True),
        (_ServiceError(400, "Throttling"), True),
        (_ServiceError(403, "AccessDenied"), False),
        (_ServiceError(404, "NoSuchKey"), False),
        (ConnectionResetError("reset by peer"), True),
        (TimeoutError("timed out"), True),
        (ValueError("bad value"), False),
        (FileNotFoundError("nope"), False),
        # s3fs re-raises a ClientError as a builtin OSError with the original as cause
        (raised_from(OSError(16, "busy"), _ServiceError(503, "SlowDown")), True),
        (raised_from(OSError(22, "invalid"), _ServiceError(400, "InvalidArgument")), False),
        # a reader that wraps a dropped connection in its own error type
        (raised_from(RuntimeError("read failed"), ConnectionResetError()), True),
    ],
)
def test_is_transient_follows_the_cause_chain(exc, transient):
    from embedfresh.core.storage import is_transient

    assert is_transient(exc) is transient


def test_store_rides_out_injected_503s(s3_endpoint, monkeypatch):
    import boto3

    from tests.reliability.fault_proxy import SLOW_DOWN, FaultPlan, FaultProxy, every

    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="storage-retries")
    with FaultProxy(s3_endpoint, FaultPlan(every(2, SLOW_DOWN))) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        store = ArtifactStore("s3://storage-retries/p")
        store.write_bytes("a/blob", b"payload")
        assert store.read_bytes("a/blob") == b"payload"
        assert store.listdir("a") == ["blob"]
        assert proxy.plan.injected["SlowDown"] >= 2


def test_store_gives_up_with_a_transient_error(s3_endpoint, monkeypatch):
    import boto3

    from embedfresh.core.exit_codes import TransientError
    from tests.reliability.fault_proxy import INTERNAL, FaultPlan, FaultProxy, always

    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="storage-gives-up")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    with FaultProxy(s3_endpoint, FaultPlan(always(INTERNAL))) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        store = ArtifactStore("s3://storage-gives-up/p")
        with pytest.raises(TransientError, match="unreachable"):
            store.write_bytes("a/blob", b"payload")
        assert proxy.plan.requests == 2  # the bounded budget, no more
        proxy.down()
        with pytest.raises(TransientError, match="unreachable"):
            store.read_bytes("a/blob")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    assert not ArtifactStore("s3://storage-gives-up/p").exists("a/blob")


def test_a_url_under_the_root_is_a_path_and_any_other_url_is_refused(store):
    store.write_bytes("reports/eval.parquet", b"rows")
    assert store.read_bytes(store.url("reports/eval.parquet")) == b"rows"
    assert store.path(store.root) == store.path("")
    elsewhere = "file:///some/other/root/reports/eval.parquet"
    with pytest.raises(BadInputError, match="URL outside the artifact root"):
        store.read_bytes(elsewhere)
    with pytest.raises(BadInputError, match="URL outside the artifact root"):
        store.exists(f"{store.root}-copy/reports/eval.parquet")


# -- local disk: file:// with a host, the umask, staged writes, fault points ----------


@pytest.mark.parametrize("root", ["file://artifacts/demo", "file://otherhost/data"])
def test_a_file_url_with_a_host_is_refused_not_dropped(root):
    with pytest.raises(BadInputError, match="names the host .*file:///absolute/path"):
        ArtifactStore(root)


def test_file_localhost_is_this_machine(tmp_path):
    assert ArtifactStore(f"file://localhost{tmp_path}").root == f"file://{tmp_path}"


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_objects_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        store = ArtifactStore(f"file://{tmp_path}")
        store.write_bytes("a/b.bin", b"x")
        local = tmp_path / "src.bin"
        local.write_bytes(b"y" * 3_000_000)
        store.put_file(str(local), "a/c.bin")
        store.write_if_match("a/d.json", b"{}", None)
    finally:
        os.umask(old)
    for name in ("b.bin", "c.bin", "d.json"):
        assert stat.S_IMODE((tmp_path / "a" / name).stat().st_mode) == 0o666 & ~umask, name
    assert (tmp_path / "a/c.bin").read_bytes() == b"y" * 3_000_000


def test_writes_stage_outside_the_objects_folder_and_dead_writers_are_swept(tmp_path):
    store = ArtifactStore(f"file://{tmp_path}")
    store.write_bytes("models/m/versions/v/w.bin", b"w")
    assert sorted(p.name for p in (tmp_path / "models/m/versions/v").iterdir()) == ["w.bin"]
    staging = tmp_path / ".staging"
    assert staging.is_dir() and not list(staging.iterdir())
    # What a writer killed mid-write leaves: one file of a dead pid, one of a live one.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname().replace(".", "_")
    gone = staging / f"w.bin.{host}.{dead.pid}.abc123.tmp"
    live = staging / f"w.bin.{host}.{os.getpid()}.def456.tmp"
    other_host = staging / f"w.bin.elsewhere.{dead.pid}.ghi789.tmp"
    for p in (gone, live, other_host):
        p.write_bytes(b"partial")
    ArtifactStore(f"file://{tmp_path}").write_bytes("x", b"x")  # the next run's store
    assert sorted(p.name for p in staging.iterdir()) == sorted([live.name, other_host.name])


def test_fault_point_kills_right_after_the_named_write_and_a_drifted_one_raises(tmp_path):
    root = tmp_path / "root"
    code = (
        "from embedfresh.core.storage import ArtifactStore\n"
        f"s = ArtifactStore('file://{root}')\n"
        "s.write_bytes('a', b'1'); s.write_if_match('b', b'2', None); s.remove('a')\n"
        "print('survived')\n"
    )
    log = tmp_path / "writes.log"

    def run(point):
        shutil.rmtree(root, ignore_errors=True)
        env = {**os.environ, "EMBEDFRESH_WRITES_LOG": str(log), "EMBEDFRESH_FAULT_POINT": point}
        log.unlink(missing_ok=True)
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    killed = run("2 cas b")
    assert killed.returncode == -9 and "survived" not in killed.stdout
    assert log.read_text().splitlines() == ["1 write a", "2 cas b"]
    assert (root / "b").read_bytes() == b"2" and (root / "a").exists()
    drifted = run("2 write b")
    assert drifted.returncode == 1 and "fault point '2 write b' drifted" in drifted.stderr
    clean = run("9 write nowhere")  # a point past the last write: the run completes
    assert clean.returncode == 0, clean.stderr
    assert log.read_text().splitlines() == ["1 write a", "2 cas b", "3 remove a"]
