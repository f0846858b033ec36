"""The fault points of a sharded checkpoint: every write of it, by either rank, killed
right after, then a plain re-run, which must leave the store as a clean run left it.

A sharded checkpoint (``parallelism=fsdp``) is written by every rank: each its shards
(``rank-NNNNN.distcp``), rank 0 DCP's metadata, the run's ``state.pt`` and ``meta.json``
and last the ``COMMIT`` that lists them all. The matrix of
:mod:`tests.reliability.test_fault_points` runs here on a training of two ranks, each a
process forked from a preloaded server with torchrun's environment: a point is named by
the rank that makes it (``rank1: 3 write .../rank-00001.distcp``,
:mod:`embedfresh.core.storage.faults`), that rank is SIGKILLed right after it and the
other rank with it (its host is lost), and the re-run of both must finish with the
clean run's store: the same files, byte-identical (JSON without clocks). The train
job's other points (lease, probe, report, version) are the file matrix's.

The same job on S3 (moto's server) is killed once, at rank 1's shard, and re-run:
the shards, their metadata and the marker go through the store's S3 scheme too, and it
ends with the clean run's weights (the ``file://`` one: one clean run for the module).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import torch
from safetensors.torch import load, load_file

from embedfresh.core.storage.faults import FAULT_POINT, WRITES_LOG
from tests.conftest import _s3_env, write_data
from tests.reliability import figures
from tests.reliability.forked import Finished, ForkServer
from tests.reliability.test_fault_points import leftovers, state
from tests.test_train_ddp import free_port

TRAIN = (
    "run_id=sharded",
    "data_interval_start=2026-01-01",
    "init=base",
    "parallelism=fsdp",
    "batch_size=16",
    "max_steps=4",
    "checkpoint_every=2",
)
RANKS = 2
BUCKET = "sharded-fault-points"


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> ForkServer:
    return ForkServer(tmp_path_factory.mktemp("fork-output-sharded"))


def run_ranks(forks: ForkServer, root: str, env: dict[str, str]) -> list:
    return forks.run_ranks(
        "train", f"artifact_root={root}", *TRAIN, world_size=RANKS, port=free_port(), env=env
    )


@dataclass(frozen=True)
class Clean:
    """The module's clean run (a plain run with the writes log), in ``store``; ``before``:
    the store before it. What a test needs of the run is read when it ends, so a test
    may then reuse ``store``."""

    before: Path
    store: Path
    ranks: list[Finished]
    points: list[str]
    state: dict[str, str]
    leftovers: list[str]
    weights: dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def clean(
    data_template: Path, forks: ForkServer, tmp_path_factory: pytest.TempPathFactory
) -> Clean:
    where = tmp_path_factory.mktemp("sharded-clean")
    store, before, log = where / "store", where / "before", where / "clean.log"
    shutil.copytree(data_template, before)
    shutil.copytree(before, store)
    ranks = run_ranks(forks, f"file://{store}", {WRITES_LOG: str(log)})
    version = store / "models/tiny/versions/sharded/model.safetensors"
    return Clean(
        before,
        store,
        ranks,
        log.read_text().splitlines() if log.exists() else [],
        state(store),
        leftovers(store),
        load_file(version) if version.exists() else {},
    )


def test_every_write_of_a_sharded_checkpoint_killed_then_a_plain_rerun_finishes_the_same(
    clean: Clean, forks: ForkServer, tmp_path: Path
) -> None:
    store, before = clean.store, clean.before
    root = f"file://{store}"

    def restore() -> None:
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(before, store)

    ranks = clean.ranks
    assert [r.exitcode for r in ranks] == [0, 0], ranks[0].stderr[-3000:] + ranks[1].stderr[-3000:]
    expected = clean.state
    assert not clean.leftovers, clean.leftovers
    points = [p for p in clean.points if "/checkpoints/" in p]
    # Both ranks' shards, rank 0's metadata, state, meta and the marker last.
    assert sum(p.startswith("rank1: ") for p in points) == 1, points
    assert points[-1].startswith("rank0: ") and points[-1].endswith("/COMMIT"), points

    failures = []
    started = time.perf_counter()
    for point in points:
        restore()
        killed_log = tmp_path / "killed.log"
        killed_log.unlink(missing_ok=True)
        killed = run_ranks(forks, root, {FAULT_POINT: point, WRITES_LOG: str(killed_log)})
        rank = int(point.split(":", 1)[0].removeprefix("rank"))
        own = [p for p in killed_log.read_text().splitlines() if p.startswith(f"rank{rank}: ")]
        if killed[rank].exitcode != -9 or own[-1:] != [point]:
            failures.append(f"{point}: not killed there (exits {[r.exitcode for r in killed]})")
            continue
        again = run_ranks(forks, root, {})
        if [r.exitcode for r in again] != [0, 0]:
            failures.append(f"{point}: re-run exits {[r.exitcode for r in again]}: "
                            f"{again[0].stderr[-800:]}")  # fmt: skip
            continue
        if left := leftovers(store):
            failures.append(f"{point}: left {left}")
        got = state(store)
        if got != expected:
            diff = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
            failures.append(f"{point}: store differs from the clean run's in {diff[:6]}")
    figures.record("fault_points", job="train (fsdp, 2 ranks)", points=len(points),
                   failed=len(failures), seconds=round(time.perf_counter() - started, 1),
                   names=points)  # fmt: skip
    assert not failures, f"{len(failures)} of {len(points)} points:\n" + "\n".join(failures)


def test_a_sharded_run_on_s3_killed_at_a_shard_resumes_to_the_same_weights(
    s3_endpoint: str, clean: Clean, forks: ForkServer, tmp_path: Path
) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    env = _s3_env(s3_endpoint)
    assert [r.exitcode for r in clean.ranks] == [0, 0], clean.ranks[1].stderr[-3000:]
    # Rank 1's shard, as the clean run on file:// named it: a point names the write by
    # its number and its path relative to the store's root, whichever the scheme.
    shard = next(p for p in clean.points if p.startswith("rank1: ") and "distcp" in p)
    root = f"s3://{BUCKET}/killed"
    write_data(root)
    log = tmp_path / "killed.log"
    killed = run_ranks(forks, root, {**env, FAULT_POINT: shard, WRITES_LOG: str(log)})
    assert killed[1].exitcode == -9, killed[1].stderr[-3000:]
    own = [p for p in log.read_text().splitlines() if p.startswith("rank1: ")]
    assert own[-1:] == [shard], own[-5:]  # killed there, on S3, by that point
    again = run_ranks(forks, root, env)
    assert [r.exitcode for r in again] == [0, 0], again[0].stderr[-3000:]
    # The clean run's weights, bit for bit: the same job on either scheme, killed or not.
    reference, got = clean.weights, _weights(s3, "killed")
    assert reference and reference.keys() == got.keys()
    assert all(torch.equal(got[k], reference[k]) for k in reference)


def _weights(s3, prefix: str) -> dict[str, torch.Tensor]:
    key = f"{prefix}/models/tiny/versions/sharded/model.safetensors"
    return load(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
