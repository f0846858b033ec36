"""The project-local Airflow of ``make demo`` and ``make airflow``: the demo's runs read
like a scheduler's (real start and end times, task logs where the API server reads them),
and the simple auth manager's password file is private (0600)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow_home import PASSWORDS_FILE, airflow_home, run_in_airflow
from tests.conftest import ROOT, job_env


def _demo_module():
    spec = importlib.util.spec_from_file_location("embedfresh_demo", ROOT / "scripts/demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- the password file ---------------------------------------------------------------------

# The real SimpleAuthManager's first start (what the API server does): it generates a
# password for each configured user into the file, creating it if missing.
INIT_AUTH_MANAGER = r"""
import json, os
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
SimpleAuthManager().init()
print(json.dumps({"file": SimpleAuthManager.get_generated_password_file()}))
"""


def test_airflow_writes_its_passwords_into_the_private_file_the_harness_made(tmp_path: Path):
    env = airflow_home(tmp_path / "home")
    env.update(
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
    )
    facts, output = run_in_airflow(INIT_AUTH_MANAGER, env)
    path = Path(facts["file"])
    assert path == tmp_path / "home" / PASSWORDS_FILE
    assert set(json.loads(path.read_text())) == {"admin"}, output
    assert _mode(path) == 0o600

    # Without it, Airflow creates the file readable by others (the process's umask).
    bare = tmp_path / "bare"
    bare.mkdir()
    env = {**env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(bare / PASSWORDS_FILE)}
    old = os.umask(0o022)
    try:
        facts, output = run_in_airflow(INIT_AUTH_MANAGER, env)
    finally:
        os.umask(old)
    assert _mode(Path(facts["file"])) & 0o077, "Airflow itself now creates it private"


# Stands in for `airflow` in a venv of its own: records what `make airflow` prepared
# before starting it (the password file's mode, where the API server will listen).
FAKE_AIRFLOW = r"""#!/bin/sh
python3 - "$@" <<'EOF'
import json, os, stat, sys
path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
with open(os.environ["RECORD"], "w") as f:
    json.dump({"argv": sys.argv[1:], "file": path, "mode": stat.S_IMODE(os.stat(path).st_mode),
               "host": os.environ.get("AIRFLOW__API__HOST"),
               "home": os.environ.get("AIRFLOW_HOME")}, f)
EOF
"""


@pytest.mark.parametrize("existing_mode", [None, 0o644])
def test_make_airflow_creates_the_password_file_0600_and_listens_on_localhost(
    tmp_path: Path, existing_mode: int | None
):
    venv, home = tmp_path / "venv", tmp_path / "airflow-home"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "airflow"
    fake.write_text(FAKE_AIRFLOW)
    fake.chmod(0o755)
    (venv / ".installed").touch()  # newer than the requirements: no venv build
    if existing_mode is not None:  # a home from before, with a readable file
        home.mkdir()
        (home / PASSWORDS_FILE).write_text('{"admin": "secret"}\n')
        (home / PASSWORDS_FILE).chmod(existing_mode)
    record = tmp_path / "record.json"
    done = subprocess.run(
        ["make", "--no-print-directory", "airflow", f"VENV={venv}", f"LOCAL_AIRFLOW_HOME={home}"],
        cwd=ROOT,
        env={**job_env(), "RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    facts = json.loads(record.read_text())
    assert facts["argv"] == ["standalone"] and facts["home"] == str(home)
    assert facts["file"] == str(home / PASSWORDS_FILE) and facts["mode"] == 0o600
    assert facts["host"] == "127.0.0.1"
    if existing_mode is not None:  # its passwords are kept
        assert json.loads((home / PASSWORDS_FILE).read_text()) == {"admin": "secret"}


# -- the demo's runs -------------------------------------------------------------------------

# What the API server does to show a task's log, and the run's times, from the database.
READ_BACK = r"""
import json, sys
from sqlalchemy import select
from airflow.models import DagRun, TaskInstance
from airflow.utils.log.log_reader import TaskLogReader
from airflow.utils.session import create_session

with create_session() as session:
    run = session.scalars(select(DagRun).where(DagRun.run_id == sys.argv[1])).one()
    ti = session.scalars(select(TaskInstance).where(TaskInstance.run_id == run.run_id)).one()
    stream, _ = TaskLogReader().read_log_chunks(ti, ti.try_number, {})
    events = [getattr(e, "event", str(e)) for e in stream]
    print(json.dumps({"start": run.start_date.isoformat(), "end": run.end_date.isoformat(),
                      "logical": run.logical_date.isoformat(), "events": events}))
"""


@pytest.mark.slow
def test_the_demos_runs_have_real_times_and_task_logs_the_api_server_reads(tmp_path: Path):
    demo = _demo_module()
    root = f"file://{tmp_path / 'store'}"
    env = airflow_home(tmp_path / "airflow-home", root)
    facts_path = tmp_path / "facts.json"
    before = dt.datetime.now(dt.UTC)
    logical = "2026-01-02T00:00:00+00:00"  # as the demo's: months before the run
    done = subprocess.run(
        [sys.executable, "-c", demo.DAG_RUN, str(ROOT / "dags"), "fleet_health", logical, "{}"]
        + [str(facts_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    facts = json.loads(facts_path.read_text())
    assert facts["state"] == "success", output
    assert "Job exited with code 0" in done.stdout  # the console still shows the task log

    back, output = run_in_airflow(READ_BACK, env, facts["run_id"])
    start, end = dt.datetime.fromisoformat(back["start"]), dt.datetime.fromisoformat(back["end"])
    assert back["logical"].startswith("2026-01-02")
    assert before <= start < end <= dt.datetime.now(dt.UTC)
    assert end - start < dt.timedelta(minutes=5)
    log = "\n".join(back["events"])
    assert "Job exited with code 0" in log, log[-3000:]
    assert "embedfresh.jobs.health" in log
    assert "Log file not found" not in log and "Could not read served logs" not in log
