"""docker-compose.yaml is valid for Debian's docker-compose (no Docker engine needed).

CI installs docker-compose (.ci/run); elsewhere the test is skipped when it is absent."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

SERVICES = {
    "postgres",
    "minio",
    "minio-init",
    "airflow-init",
    "api-server",
    "scheduler",
    "dag-processor",
    "triggerer",
}


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_compose_config_is_valid_and_complete():
    proc = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yaml"), "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert SERVICES <= set(config["services"])
    scheduler = config["services"]["scheduler"]
    env = scheduler["environment"]
    assert env["EMBEDFRESH_ARTIFACT_ROOT"].startswith("s3://")
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert "aws" in env["AIRFLOW_CONN_AWS_DEFAULT"]
    assert scheduler["build"]["context"] == str(ROOT)
