"""Train and evaluate with the artifact root on S3 (moto's server on 127.0.0.1, reached
over HTTP by the job processes), including a SIGKILL + restart that resumes from the
checkpoints in the bucket and ends bit-exact."""

from __future__ import annotations

import hashlib
import json

import pytest

from embedfresh.core import layout
from embedfresh.ml.checkpoint import WEIGHTS
from tests.conftest import run_job, write_data
from tests.test_checkpoint import STEPS, kill_after_step, train_ok

BUCKET = "s3-pipeline"
PREFIX = "prod"


@pytest.fixture(scope="module")
def s3(s3_endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture(scope="module")
def s3_data_root(s3) -> str:
    """One bucket for the module, holding the generated data set; runs differ by id."""
    s3.create_bucket(Bucket=BUCKET)
    root = f"s3://{BUCKET}/{PREFIX}"
    write_data(root)
    return root


def keys(s3, rel: str) -> list[str]:
    """Keys under ``rel`` (relative to the root), themselves relative to ``rel``."""
    prefix = f"{PREFIX}/{rel}/"
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out += [o["Key"].removeprefix(prefix) for o in page.get("Contents", [])]
    return sorted(out)


def get(s3, rel: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{rel}")["Body"].read()


def weights_sha(s3, version: str) -> str:
    return hashlib.sha256(get(s3, f"{layout.model_version('tiny', version)}/{WEIGHTS}")).hexdigest()


def committed_checkpoints(s3, run_id: str) -> list[int]:
    names = keys(s3, layout.checkpoints("tiny", run_id))
    return sorted(
        int(n.split("/")[0].removeprefix("step-")) for n in names if n.endswith("/COMMIT")
    )


@pytest.fixture(scope="module")
def reference(s3, s3_data_root: str) -> str:
    summary = json.loads(train_ok(s3_data_root, "uninterrupted").stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] is None
    assert summary["steps"] == STEPS
    assert summary["report"] == f"{s3_data_root}/runs/tiny/uninterrupted/reports/train.json"
    return weights_sha(s3, "uninterrupted")


def test_the_data_set_is_in_the_bucket(s3, s3_data_root):
    assert keys(s3, "datasets/products/train/dt=2026-01-01") == ["part-00000.parquet"]
    assert keys(s3, "datasets/products/eval") == ["part-00000.parquet"]


def test_train_then_evaluate_on_s3(s3, s3_data_root, reference):
    version_dir = layout.model_version("tiny", "uninterrupted")
    assert keys(s3, version_dir) == ["COMMIT", "model.json", "model.safetensors", "tokenizer.json"]
    train_report = json.loads(get(s3, layout.report("tiny", "uninterrupted", "train")))
    assert train_report["status"] == "ok"
    assert train_report["version_url"] == f"{s3_data_root}/{version_dir}"
    assert train_report["sources"] == [
        f"{s3_data_root}/datasets/products/train/dt=2026-01-01/part-00000.parquet"
    ]
    # Checkpoints every 7 steps, keep_last=3: the last three before the final step.
    assert committed_checkpoints(s3, "uninterrupted") == [14, 21, 28]

    result = run_job(
        "evaluate", f"artifact_root={s3_data_root}", "run_id=uninterrupted", "batch_size=128"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert keys(s3, layout.reports("tiny", "uninterrupted")) == [
        "eval.examples.parquet",
        "eval.json",
        "eval.queries.parquet",
        "train.json",
    ]
    report = json.loads(get(s3, layout.report("tiny", "uninterrupted", "eval")))
    assert report["version"] == "uninterrupted"
    assert report["n_examples"] == 768
    assert report["outcomes"]["examples"].startswith(f"{s3_data_root}/runs/tiny/uninterrupted/")
    for name in ("accuracy", "auc", "recall_at_10"):
        assert 0.0 <= report["metrics"][name] <= 1.0


def test_sigkill_and_restart_on_s3_resumes_bit_exact(s3, s3_data_root, reference):
    run_id = "killed"
    kill_after_step(s3_data_root, run_id, kill_at=17)
    committed = committed_checkpoints(s3, run_id)
    assert committed and committed[-1] >= 14, committed
    assert keys(s3, layout.model_version("tiny", run_id)) == []

    summary = json.loads(train_ok(s3_data_root, run_id).stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] is not None, "the restart did not resume"
    assert summary["resumed_from"]["step"] == committed[-1]
    assert summary["resumed_from"]["url"] == (
        f"{s3_data_root}/{layout.checkpoint('tiny', run_id, committed[-1])}"
    )
    assert weights_sha(s3, run_id) == reference
