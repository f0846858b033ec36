"""Leases on units of work (:mod:`embedfresh.core.leases`): two starts of one run id,
one runs and the other exits 75 naming the holder; a holder that is gone (its pid, on
this host) or silent past its expiry (any host) is taken over, and the work resumes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embedfresh.core import layout
from embedfresh.core.exit_codes import ConflictError, ExitCode, TransientError
from embedfresh.core.leases import Lease, lease_seconds
from embedfresh.core.storage import ArtifactStore, json_bytes
from tests.conftest import ROOT, job_env, run_job

MODEL, RUN = "tiny", "leased"


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "file":
        return ArtifactStore(f"file://{tmp_path / 'root'}")
    import boto3

    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"leases-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return ArtifactStore(f"s3://{bucket}/root")


def _rel(unit: str = "train") -> str:
    return f"{layout.run_dir(MODEL, RUN)}/leases/{unit}.json"


def _plant(store: ArtifactStore, host: str, pid: int, expires_in: float) -> None:
    """A lease as another holder left it."""
    now = time.time()
    store.write_bytes(
        _rel(),
        json_bytes(
            {"unit": "train", "host": host, "pid": pid, "started_at": "earlier",
             "heartbeat_at": "earlier", "expires": now + expires_in}
        ),
    )  # fmt: skip


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_one_holder_at_a_time_and_release_frees_it(store):
    with Lease.acquire(store, MODEL, RUN, "train", seconds=30) as held:
        doc = json.loads(store.read_bytes(_rel()))
        assert (doc["host"], doc["pid"]) == (socket.gethostname(), os.getpid())
        with pytest.raises(
            TransientError, match=f"held by {socket.gethostname()} pid {os.getpid()}"
        ):
            Lease.acquire(store, MODEL, RUN, "train", seconds=30)
        # Another unit of the same run (a mapped embed task's shards) is free.
        Lease.acquire(store, MODEL, RUN, "embed-shards-0-1", seconds=30).release()
        assert held.url.endswith(_rel())
    assert not store.exists(_rel())
    Lease.acquire(store, MODEL, RUN, "train", seconds=30).release()


def test_a_live_holder_on_another_host_is_waited_for_until_its_lease_expires(store):
    _plant(store, "other-host", 1, expires_in=60)
    # "expires in N s": N is 60 less the time since the lease was planted (a loaded
    # box takes seconds between the two), never more than 60 and never expired.
    with pytest.raises(
        TransientError, match=r"held by other-host pid 1 .*expires in ([1-5]?[0-9]|60) s"
    ):
        Lease.acquire(store, MODEL, RUN, "train", seconds=30)
    _plant(store, "other-host", 1, expires_in=-1)
    lease = Lease.acquire(store, MODEL, RUN, "train", seconds=30)
    assert lease.doc["took_over_from"]["host"] == "other-host"
    lease.release()


def test_a_dead_holder_on_this_host_is_taken_over_at_once(store):
    _plant(store, socket.gethostname(), _dead_pid(), expires_in=600)
    lease = Lease.acquire(store, MODEL, RUN, "train", seconds=30)
    assert lease.doc["pid"] == os.getpid()
    lease.release()


def test_a_holder_whose_lease_was_taken_over_cannot_renew_or_remove_it(store):
    lease = Lease.acquire(store, MODEL, RUN, "train", seconds=30)
    lease._stop.set()  # no heartbeat thread: renew by hand below
    _plant(store, "new-holder", 7, expires_in=60)  # what a takeover leaves
    with pytest.raises(ConflictError):
        lease.renew()
    lease.release()
    assert json.loads(store.read_bytes(_rel()))["host"] == "new-holder"


def test_the_heartbeat_pushes_the_expiry_forward(store):
    with Lease.acquire(store, MODEL, RUN, "train", seconds=0.6) as lease:
        first = lease.doc["expires"]
        time.sleep(0.9)
        assert json.loads(store.read_bytes(_rel()))["expires"] > first


def test_lease_seconds_comes_from_the_environment(monkeypatch):
    assert lease_seconds() == 120.0
    monkeypatch.setenv("EMBEDFRESH_LEASE_SECONDS", "5")
    assert lease_seconds() == 5.0
    monkeypatch.setenv("EMBEDFRESH_LEASE_SECONDS", "soon")
    with pytest.raises(ValueError, match="not a positive number"):
        lease_seconds()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_two_starts_of_one_run_one_runs_the_other_exits_75_then_a_start_takes_over(root):
    """The zombie-and-retry race: while the first start holds the run (frozen with
    SIGSTOP after its first checkpoint: alive, silent), a second start exits 75 naming
    it; once the holder is SIGKILLed a third start takes the lease over and resumes from
    the checkpoint, and the weights are bit-exact with an uninterrupted run's."""
    store_dir = Path(root.removeprefix("file://"))
    train = ("data_interval_start=2026-01-01", "max_steps=200", "checkpoint_every=10")
    reference = run_job("train", f"artifact_root={root}", "run_id=reference", *train)
    assert reference.returncode == 0, reference.stderr[-3000:]

    sets = (f"artifact_root={root}", "run_id=raced", *train)
    cmd = [sys.executable, "-m", "embedfresh.jobs.train"]
    for s in sets:
        cmd += ["--set", s]
    holder = subprocess.Popen(
        cmd, cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    lease_file = store_dir / "runs/tiny/raced/leases/train.json"
    try:
        first_checkpoint = store_dir / "runs/tiny/raced/checkpoints/step-00000010/COMMIT"
        deadline = time.monotonic() + 180
        while not first_checkpoint.exists():
            assert time.monotonic() < deadline and holder.poll() is None, "no checkpoint"
            time.sleep(0.02)
        holder.send_signal(signal.SIGSTOP)
        second = run_job("train", *sets)
        assert second.returncode == ExitCode.TRANSIENT, second.stderr[-3000:]
        line = second.stderr.strip().splitlines()[-1]
        assert line.startswith("train: error: this unit of work is held by"), line
        assert f"pid {holder.pid} " in line and "a retry takes it over" in line, line
        assert json.loads(lease_file.read_text())["pid"] == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not (store_dir / "models/tiny/versions/raced/COMMIT").exists()

    third = run_job("train", *sets)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "taking over" in third.stderr and f"pid {holder.pid}" in third.stderr
    assert "resuming from" in third.stderr
    assert not lease_file.exists()
    assert _sha(store_dir / "models/tiny/versions/raced/model.safetensors") == _sha(
        store_dir / "models/tiny/versions/reference/model.safetensors"
    )


def test_sigterm_anywhere_in_a_job_exits_75_with_one_line_and_frees_the_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM outside the training loop (Airflow's on_kill, Batch stopping a job), in
    any job run through :func:`embedfresh.core.cli.run_job`: exit 75, one line, the lease
    released for the retry at once, the previous SIGTERM handler back."""
    from embedfresh.core.cli import run_job as cli_run_job
    from embedfresh.core.config import ReleaseConfig

    store_dir = tmp_path / "root"
    seen: dict[str, bool] = {}

    def job(cfg: ReleaseConfig) -> dict:
        store = ArtifactStore(cfg.artifact_root)
        seen["lease before the first write"] = store.exists("runs/tiny/t/leases/work.json")
        store.write_bytes("runs/tiny/t/reports/partial.json", b"{}")
        seen["lease after it"] = store.exists("runs/tiny/t/leases/work.json")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        seen["ran on"] = True
        return {}

    previous = signal.getsignal(signal.SIGTERM)
    argv = ["--set", f"artifact_root=file://{store_dir}", "--set", "run_id=t"]
    code = cli_run_job("work", ReleaseConfig, job, argv)
    assert code == ExitCode.TRANSIENT
    assert seen == {"lease before the first write": False, "lease after it": True}
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == "work: error: stopped by SIGTERM; the retry resumes from what is committed"
    assert not (store_dir / "runs/tiny/t/leases/work.json").exists()
    assert (store_dir / "runs/tiny/t/reports/partial.json").exists()
    assert not (store_dir / "runs/tiny/t/results").exists()
    assert signal.getsignal(signal.SIGTERM) is previous
