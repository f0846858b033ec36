"""A throw-away Airflow for tests: a private AIRFLOW_HOME with a migrated SQLite database,
and ``dag.test()`` in a fresh interpreter.

``airflow db migrate`` costs ~10 s, so it runs once per test process into a template
that each :func:`airflow_home` call copies. Everything lives under the caller's folder
(and a temporary template removed at exit): nothing touches a developer's Airflow.

Usage::

    env = airflow_home(tmp_path / "airflow-home", artifact_root)
    facts = run_in_airflow(SCRIPT, env, root, timeout=300)  # SCRIPT prints JSON last
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from embedfresh.operators.resources import pool_command
from tests.conftest import ROOT, job_env

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
DAGS_FOLDER = ROOT / "dags"
PLUGINS_FOLDER = ROOT / "plugins"
DB_FILE = "airflow.db"
#: The simple auth manager's generated passwords (its default name, under AIRFLOW_HOME).
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"

_template: Path | None = None


def airflow_env(home: Path, artifact_root: str | None = None) -> dict[str, str]:
    """Environment of a job-like child process whose Airflow lives in ``home``.

    The venv's bin comes first on PATH (``airflow standalone`` starts its parts as
    ``airflow ...`` subprocesses), examples are off, and the project's DAGs and plugins
    are loaded. ``artifact_root`` becomes the Params' default (EMBEDFRESH_ARTIFACT_ROOT).
    """
    extra = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / DB_FILE}",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / PASSWORDS_FILE),
    }
    if artifact_root is not None:
        extra["EMBEDFRESH_ARTIFACT_ROOT"] = artifact_root
    env = job_env(extra)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _migrated_template() -> Path:
    global _template
    if _template is None:
        home = Path(tempfile.mkdtemp(prefix="airflow-home-template-"))
        atexit.register(shutil.rmtree, home, True)
        proc = subprocess.run(
            [AIRFLOW, "db", "migrate"],
            env=airflow_env(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        # The accelerator pool the DAGs' device steps take (operators/resources.py), as
        # `make airflow`, the demo and docker-compose.yaml create it.
        pool = subprocess.run(
            [AIRFLOW, *pool_command()[1:]],
            env=airflow_env(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert pool.returncode == 0, pool.stdout[-2000:] + pool.stderr[-3000:]
        _template = home
    return _template


def private_passwords_file(home: Path) -> Path:
    """The password file of ``home``, created empty with mode 0600 if missing (made 0600
    if not): the simple auth manager opens it with ``open(path, "a+")``, which creates it
    readable by every local user (0644) and keeps the mode of a file that exists."""
    path = home / PASSWORDS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
    path.chmod(0o600)
    return path


def airflow_home(home: Path, artifact_root: str | None = None) -> dict[str, str]:
    """Create ``home`` holding a freshly migrated database and a private (0600) password
    file; returns :func:`airflow_env`."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy2(_migrated_template() / DB_FILE, home / DB_FILE)
    private_passwords_file(home)
    return airflow_env(home, artifact_root)


def promote_initial_version(root: str, version: str, model: str = "tiny") -> None:
    """Publish ``model``'s base weights as ``version`` and make it live as a bare release
    (no corpora, as ``publish_model`` does), for DAGs that start from a production
    version (corpus_embeddings, accelerator_parity): a head of the demo's features, as a
    production trained on the demo's data has."""
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.data.schema import DEMO_FEATURES
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec
    from tests.releasing import bare_release

    store = ArtifactStore(root)
    spec = get_spec(model).model_copy(update={"features": DEMO_FEATURES})
    versions.publish(store, spec, version, cpu_state_dict(versions.build_model(spec, 0)), {})
    bare_release(store, model, version)


def run_in_airflow(
    script: str, env: dict[str, str], *args: str, timeout: float = 300
) -> tuple[dict, str]:
    """Run ``python -c script args...`` in ``env``; returns (its last stdout line as JSON,
    the output tail for assertion messages). Fails the test on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, output
    return json.loads(proc.stdout.strip().splitlines()[-1]), output


#: Python for the child interpreter: ``load_dag(folder, dag_id)`` parses the DAG folder
#: (no import errors allowed; Deadline Alerts dropped, see there) and ``run_facts(run, xcom_tasks)`` reads a finished run back
#: from the database: state, task states by map index, return values, Asset events.
DAG_TEST_HELPERS = r"""
import datetime as dt, json, sys
from sqlalchemy import select
from airflow.dag_processing.dagbag import DagBag
from airflow.models import DagRun, TaskInstance
from airflow.models.asset import AssetEvent, AssetModel
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session


def load_dag(folder, dag_id):
    bag = DagBag(dag_folder=folder)
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags[dag_id]
    # Airflow 3.3.2's dag.test() round-trips the DAG through serialization without the
    # deadline-alert ids the DB copy gets, and DagRun.update_state then fails on success
    # ("'dict' object has no attribute 'hex'"). Deadlines need the scheduler anyway
    # (tests/test_deadline.py runs one), so dag.test() runs without them.
    dag.deadline = None
    return dag


def run_facts(run, xcom_tasks=()):
    with create_session() as session:
        dr = session.scalars(select(DagRun).where(DagRun.run_id == run.run_id)).one()
        tis = session.scalars(select(TaskInstance).where(TaskInstance.run_id == dr.run_id)).all()
        xcoms = {}
        for task_id in xcom_tasks:
            row = session.scalars(
                select(XComModel).where(
                    XComModel.run_id == dr.run_id,
                    XComModel.task_id == task_id,
                    XComModel.key == "return_value",
                )
                .order_by(XComModel.map_index)  # a mapped task's: its first map index's
            ).first()
            xcoms[task_id] = None if row is None else XComModel.deserialize_value(row)
        events = session.execute(
            select(AssetModel.uri, AssetEvent.extra).join(
                AssetModel, AssetModel.id == AssetEvent.asset_id
            )
        ).all()
        return {
            "run_id": dr.run_id,
            "state": str(dr.state),
            "tasks": sorted([ti.task_id, ti.map_index, str(ti.state)] for ti in tis),
            "xcom": xcoms,
            "asset_events": sorted(([uri, extra] for uri, extra in events), key=lambda e: e[0]),
        }
"""
