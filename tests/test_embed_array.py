"""Embeddings as one AWS Batch array job: the plan, the children, the operator.

Job side: ``mode=plan`` lists the shards whose output is not committed and current (the
embed job's own reuse rule) and writes the plan; a child embeds slice
``AWS_BATCH_JOB_ARRAY_INDEX`` of it and writes its result record as ``<name>+<index>``;
a child outside the plan, or given another plan's bytes, exits 2 before any write.

Operator side, through the test-side Batch executor (tests/batch_harness.py: moto's
Batch API, every child a real local process, Batch's retry strategy applied): a
50,000-row corpus embedded as an array job of 10 children, one child failing once
(exit 75) and retried by Batch, the verifier's manifest complete, and every vector
byte-equal to the local runner's output for the same corpus; a re-run submits nothing,
and after one shard is lost a plain job for that shard alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import cli, layout, markers
from embedfresh.core.config import EmbedConfig
from embedfresh.core.embed_plan import (
    EmbedPlan,
    plan_path,
    plan_slice,
    read_plan,
    slice_count,
    write_plan,
)
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.results import array_child_name, child_result_name, result_name
from embedfresh.core.shards import commit_name
from embedfresh.core.storage import ArtifactStore
from tests.conftest import run_job

LOG = logging.getLogger("tests.embed_array")
WORDS = (
    "red blue green black white cotton wool linen shirt dress jacket boots lamp desk "
    "chair phone case cable charger kettle mug pan knife garden hose drill saw tent"
).split()


def publish_tiny(root: str) -> ArtifactStore:
    """Model ``tiny`` version ``v1`` (seeded random weights) in the store at ``root``."""
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    store = ArtifactStore(root)
    spec = get_spec("tiny")
    versions.publish(store, spec, "v1", cpu_state_dict(versions.build_model(spec, 0)), {})
    return store


def write_corpus(store: ArtifactStore, name: str, rows: int, shards: int, seed: int = 0) -> None:
    """``rows`` short product-like texts in ``shards`` equal Parquet shards."""
    rng = np.random.default_rng(seed)
    per = rows // shards
    for s in range(shards):
        ids = np.arange(s * per, (s + 1) * per, dtype=np.int64)
        lengths = rng.integers(2, 7, size=per)
        picks = rng.integers(0, len(WORDS), size=int(lengths.sum()))
        texts, at = [], 0
        for n in lengths:
            texts.append(" ".join(WORDS[k] for k in picks[at : at + n]))
            at += n
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": pa.array(ids), "text": pa.array(texts)}), sink)
        store.write_bytes(
            f"{layout.corpus(name)}/{layout.part_name(s)}", sink.getvalue().to_pybytes()
        )


def part_hashes(store: ArtifactStore, corpus: str) -> dict[str, str]:
    out = layout.embeddings("tiny", "v1", corpus)
    return {
        n: hashlib.sha256(store.read_bytes(f"{out}/{n}")).hexdigest()
        for n in sorted(store.listdir(out))
        if n.endswith(".parquet")
    }


def run_in_process(monkeypatch: pytest.MonkeyPatch, index: int | None, *sets: str) -> int:
    if index is None:
        monkeypatch.delenv("AWS_BATCH_JOB_ARRAY_INDEX", raising=False)
    else:
        monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", str(index))
    from embedfresh.jobs.embed import embed

    argv: list[str] = []
    for s in sets:
        argv += ["--set", s]
    return cli.run_job(
        "embed", EmbedConfig, embed, [*argv, "--result-name", "dag:embed", "--attempt-id", "a1"]
    )


# --- pure parts ------------------------------------------------------------------------


def test_slices_are_contiguous_balanced_and_cover_every_shard():
    shards = [0, 3, 4, 5, 9, 10, 11, 12, 40, 41, 77]
    for slices in range(1, len(shards) + 1):
        parts = [plan_slice(shards, slices, i) for i in range(slices)]
        assert [i for p in parts for i in p] == shards
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert all(parts), slices
    assert slice_count(25_000, 10_000) == 10_000 and slice_count(7, 1000) == 7
    with pytest.raises(ValueError, match="1 to 10000"):
        slice_count(10, 10_001)


def test_child_record_names_are_distinct_and_never_a_tasks():
    base = result_name("embed", dag_id="corpus_embeddings")
    names = {child_result_name(base, i) for i in range(10_000)}
    assert len(names) == 10_000 and base not in names
    assert child_result_name(base, 7) == "corpus_embeddings:embed+7"
    # A mapped task's name (``:<map index>``) is never a child's (``+<index>``).
    assert result_name("embed", dag_id="corpus_embeddings", map_index=7) not in names
    long = result_name("e" * 250, dag_id="d")
    assert len(child_result_name(long, 9999)) <= 200
    assert child_result_name(long, 1) != child_result_name(long, 11)
    assert array_child_name("x", {}) == "x"
    assert array_child_name("x", {"AWS_BATCH_JOB_ARRAY_INDEX": "3"}) == "x+3"
    with pytest.raises(BadInputError, match="whole number"):
        array_child_name("x", {"AWS_BATCH_JOB_ARRAY_INDEX": "three"})


def test_plan_round_trip_refuses_other_bytes_and_indices_outside(tmp_path: Path):
    store = ArtifactStore(f"file://{tmp_path}")
    rel = plan_path("tiny", "run1", "dag:embed", "abc")
    plan = EmbedPlan("tiny", "v1", "c", "run1", [1, 2, 5], 2, [0, 3, 4], [])
    sha = write_plan(store, rel, plan)
    back = read_plan(store, rel, sha)
    assert back.shards == [1, 2, 5] and back.slices == 2 and back.reused == [0, 3, 4]
    assert back.slice(0) == [1] and back.slice(1) == [2, 5]
    with pytest.raises(BadInputError, match="outside the plan's 2 slice"):
        back.slice(2)
    with pytest.raises(BadInputError, match="not the one this job was submitted with"):
        read_plan(store, rel, "0" * 64)
    with pytest.raises(BadInputError, match="does not exist"):
        read_plan(store, plan_path("tiny", "run1", "dag:embed", "other"))


def test_config_takes_the_index_from_batch_and_refuses_mixed_settings(monkeypatch):
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", "4")
    cfg = EmbedConfig(version="v1", plan="runs/tiny/r/plans/x/a.json")
    assert cfg.array_index == 4 and cfg.report_kind == "embed-products-child-4"
    assert cfg.lease_unit("embed") != EmbedConfig(
        version="v1", plan=cfg.plan, array_index=5
    ).lease_unit("embed")
    monkeypatch.delenv("AWS_BATCH_JOB_ARRAY_INDEX")
    assert EmbedConfig(version="v1", plan=cfg.plan).array_index == 0  # a plain job: slice 0
    # Two corpora embedded in one run (mapped side by side) never share a report or a lease.
    docs = EmbedConfig(version="v1", corpus="docs", shards=[0, 1])
    assert (docs.report_kind, docs.lease_unit("embed")) == (
        "embed-docs-0-1",
        "embed-docs-shards-0-1",
    )
    assert EmbedConfig(version="v1", corpus="docs", mode="plan", plan="p.json").report_kind == (
        "embed-docs-plan"
    )
    whole = EmbedConfig(version="v1", corpus="docs")
    assert (whole.report_kind, whole.lease_unit("embed_verify")) == (
        "embed-docs",
        "embed_verify-docs",
    )
    for bad, message in (
        ({"plan": cfg.plan, "shards": [1]}, "not both"),
        ({"mode": "plan"}, "mode=plan needs plan"),
        ({"array_index": 1}, "needs plan"),
        ({"plan": "/abs/plan.json"}, "relative path"),
        ({"plan": "runs/../x.json"}, "relative path"),
        ({"mode": "plan", "plan": "p.json", "max_children": 10_001}, "10000"),
    ):
        with pytest.raises(ValueError, match=message):
            EmbedConfig(version="v1", **bad)


# --- the job: plan, children ----------------------------------------------------------


def test_plan_then_children_embed_every_pending_shard_once(tmp_path: Path, monkeypatch, capsys):
    root = f"file://{tmp_path}"
    store = publish_tiny(root)
    write_corpus(store, "small", rows=600, shards=6)
    common = [f"artifact_root={root}", "version=v1", "corpus=small", "run_id=r1"]
    rel = plan_path("tiny", "r1", "dag:embed", "a1")

    # A shard committed beforehand is reused; the rest are planned over 4 slices.
    assert run_in_process(monkeypatch, None, *common, "shards=[2]") == 0
    assert (
        run_in_process(monkeypatch, None, *common, "mode=plan", f"plan={rel}", "max_children=4")
        == 0
    )
    planned = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        planned["slices"] == 4 and planned["shards_pending"] == 5 and planned["shards_reused"] == 1
    )
    plan = read_plan(store, rel, planned["plan_sha256"])
    assert plan.shards == [0, 1, 3, 4, 5] and plan.reused == [2]
    # The planner embeds nothing and writes nothing but its plan (and its record).
    assert not store.exists(f"{layout.embeddings('tiny', 'v1', 'small')}/{commit_name(0)}")

    sha = planned["plan_sha256"]
    for index in range(4):
        assert run_in_process(monkeypatch, index, *common, f"plan={rel}", f"plan_sha256={sha}") == 0
    out = layout.embeddings("tiny", "v1", "small")
    assert all(markers.verify(store, out, commit_name(i)).ok for i in range(6))
    done = []
    for index in range(4):
        record = store.read_json(layout.result("tiny", "r1", f"dag:embed+{index}"))
        assert record["attempt_id"] == "a1" and record["summary"]["array_index"] == index
        assert record["summary"]["shards_done"] == plan.slice(index)
        done += record["summary"]["shards_done"]
    assert sorted(done) == [0, 1, 3, 4, 5]
    # Planned again: nothing pending.
    rel2 = plan_path("tiny", "r1", "dag:embed", "a2")
    assert run_in_process(monkeypatch, None, *common, "mode=plan", f"plan={rel2}") == 0
    assert read_plan(store, rel2).shards == [] and read_plan(store, rel2).slices == 0


def test_a_child_outside_the_plan_exits_2_before_any_write(tmp_path: Path):
    root = f"file://{tmp_path}"
    store = publish_tiny(root)
    write_corpus(store, "small", rows=200, shards=2)
    rel = plan_path("tiny", "r1", "dag:embed", "a1")
    sha = write_plan(store, rel, EmbedPlan("tiny", "v1", "small", "r1", [0, 1], 2, [], []))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    common = [f"artifact_root={root}", "version=v1", "corpus=small", "run_id=r1", f"plan={rel}"]
    for env, sets, message in (
        (
            {"AWS_BATCH_JOB_ARRAY_INDEX": "2"},
            [f"plan_sha256={sha}"],
            "array index 2 is outside the plan's 2 slice(s)",
        ),
        (
            {"AWS_BATCH_JOB_ARRAY_INDEX": "0"},
            ["plan_sha256=" + "f" * 64],
            "not the one this job was submitted with",
        ),
        ({"AWS_BATCH_JOB_ARRAY_INDEX": "0"}, ["run_id=r2"], "this job is"),
    ):
        proc = run_job("embed", *common, *sets, env=env)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


# --- the operator, through the Batch executor -----------------------------------------

RUN = "scheduled__2026-01-02T00:00:00+00:00"
CORPUS = "products50k"
ROWS, SHARDS = 50_000, 20  # 2,500 rows a shard


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch):
    from tests.batch_harness import moto_batch

    yield from moto_batch(monkeypatch)


@pytest.fixture
def executor(batch: Any, monkeypatch: pytest.MonkeyPatch):
    from tests.batch_harness import run_batch_executor

    yield from run_batch_executor(monkeypatch, runnable_delay=0.1, max_parallel=2)


def array_operator(root: str, **kwargs: Any) -> Any:
    from embedfresh.operators.embed import BatchArrayEmbeddingOperator
    from tests.batch_harness import PYTHON, settings

    return BatchArrayEmbeddingOperator(
        task_id="embed",
        artifact_root=root,
        model="tiny",
        version="v1",
        corpus=CORPUS,
        run_id=RUN,
        execution_mode="aws_batch",
        runner_settings=settings(retry_attempts=3, python=PYTHON, poll_interval=0.5),
        **kwargs,
    )


def batch_job_name(op: Any) -> str:
    """The name the runner gives this task's Batch job (deterministic per task instance)."""
    from embedfresh.core.results import ResultTicket
    from embedfresh.operators import JobSpec

    spec = JobSpec(job="embed", settings={"run_id": RUN}, result=ResultTicket("embed", "x"))
    return op.runner.job_name(spec)


@pytest.mark.slow
def test_50k_rows_as_an_array_job_with_a_retried_child_equal_the_local_runner(
    tmp_path: Path, executor: Any
):
    from embedfresh.operators import ShardEmbeddingOperator

    roots = {}
    for kind in ("batch", "local"):
        roots[kind] = f"file://{tmp_path / kind}"
        write_corpus(publish_tiny(roots[kind]), CORPUS, rows=ROWS, shards=SHARDS)
    stores = {kind: ArtifactStore(root) for kind, root in roots.items()}

    op = array_operator(roots["batch"], max_children=10)
    # Child 3's first attempt ends as a transient fault (exit 75): Batch's retry strategy
    # (evaluateOnExit) runs it again, the task never sees it.
    executor.fail(
        job_name=batch_job_name(op), array_index=3, attempt=1, fault="exit", exit_code=75, after=0.2
    )
    summary = op.execute({})

    [submit] = executor.submits
    assert submit["arrayProperties"] == {"size": 10}
    command = " ".join(submit["containerOverrides"]["command"])
    assert "plan=runs/tiny/" in command and "shards=" not in command
    # Far under Batch's 30 KiB SubmitJob payload, and the same size for any corpus.
    assert len(json.dumps(submit)) < 4 * 1024, len(json.dumps(submit))
    parent = submit_id = executor.calls_of("SubmitJob")[0].job_id
    first, second = executor.attempts_of(f"{parent}:3")
    assert (first.exit_code, second.exit_code) == (75, 0)
    assert all(len(executor.attempts_of(f"{submit_id}:{i}")) == 1 for i in range(10) if i != 3)

    assert summary["children"] == 10 and summary["children_by_state"] == {"SUCCEEDED": 10}
    assert summary["children_retried"] == [3]
    assert summary["shards_pending"] == SHARDS and summary["shards_embedded"] == SHARDS
    assert summary["rows"] == ROWS and summary["shards_reused"] == 0

    # The verify step is the same for both fan-outs: every shard in, manifest written.
    verified = run_job(
        "embed_verify",
        f"artifact_root={roots['batch']}",
        "version=v1",
        f"corpus={CORPUS}",
        f"run_id={RUN}",
    )
    assert verified.returncode == 0, verified.stderr
    manifest = stores["batch"].read_json(
        f"{layout.embeddings('tiny', 'v1', CORPUS)}/_MANIFEST.json"
    )
    assert manifest["rows"] == ROWS and len(manifest["parts"]) == SHARDS

    # The local runner (one process, every shard) writes the very same bytes.
    local = ShardEmbeddingOperator(
        task_id="embed_local", model="tiny", artifact_root=roots["local"], version="v1", corpus=CORPUS,
        run_id=RUN, env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert local.execute({})["rows"] == ROWS
    batch_parts = part_hashes(stores["batch"], CORPUS)
    assert len(batch_parts) == SHARDS and batch_parts == part_hashes(stores["local"], CORPUS)

    # A re-run finds every shard committed and current: nothing is submitted.
    again = array_operator(roots["batch"], max_children=10).execute({})
    assert len(executor.submits) == 1
    assert again["shards_reused"] == SHARDS and again["shards_embedded"] == 0
    assert again["rows_reused"] == ROWS and again["rows"] == 0  # from the commit markers

    # One shard lost (its marker gone): one slice left, a plain job for it alone.
    stores["batch"].remove(f"{layout.embeddings('tiny', 'v1', CORPUS)}/{commit_name(7)}")
    redo = array_operator(roots["batch"], max_children=10).execute({})
    assert len(executor.submits) == 2 and "arrayProperties" not in executor.submits[1]
    assert redo["shards_embedded"] == 1 and redo["shards_reused"] == SHARDS - 1
    assert redo["rows"] + redo["rows_reused"] == ROWS and redo["rows"] > 0
    assert part_hashes(stores["batch"], CORPUS) == batch_parts


@pytest.fixture
def slow_executor(batch: Any, monkeypatch: pytest.MonkeyPatch):
    """Jobs stay RUNNABLE for 8 s: a retry started meanwhile finds the job live."""
    from tests.batch_harness import run_batch_executor

    yield from run_batch_executor(monkeypatch, runnable_delay=8.0, max_parallel=2)


def test_deferred_array_job_a_retry_reattaches_and_a_resume_reads_every_child(
    tmp_path: Path, slow_executor: Any
):
    from airflow.sdk.exceptions import TaskDeferred

    from tests.batch_harness import PYTHON, settings

    root = f"file://{tmp_path}"
    write_corpus(publish_tiny(root), CORPUS, rows=600, shards=6)

    def operator(**batch: Any) -> Any:
        from embedfresh.operators.embed import BatchArrayEmbeddingOperator

        return BatchArrayEmbeddingOperator(
            task_id="embed", model="tiny", artifact_root=root, version="v1", corpus=CORPUS, run_id=RUN,
            max_children=3, execution_mode="aws_batch",
            runner_settings=settings(python=PYTHON, poll_interval=0.5, **batch),
        )  # fmt: skip

    with pytest.raises(TaskDeferred) as info:
        operator(deferrable=True).execute({})
    deferred = info.value
    [submit] = slow_executor.submits
    assert submit["arrayProperties"] == {"size": 3}

    # The worker is lost while the job waits: the retry (a fresh operator, a new result
    # ticket and a new plan) finds the live job by its name and waits on it: no second
    # SubmitJob, and it reads the records of the children of the job it attached to.
    retried = operator().execute({})
    assert len(slow_executor.submits) == 1
    # ... and it did not plan again (the shards the live job embeds are pending too).
    plans = sorted((tmp_path / f"runs/tiny/{RUN}/plans").rglob("*.json"))
    assert len(plans) == 1, plans
    assert retried["children"] == 3 and retried["shards_embedded"] == 6 and retried["rows"] == 600

    # The deferred task resumed by the triggerer's event reads the same children.
    job_id = slow_executor.calls_of("SubmitJob")[0].job_id
    event = {"status": "success", "job_id": job_id}
    resumed = operator(deferrable=True).execute_complete({}, event, **deferred.kwargs)
    assert {k: resumed[k] for k in ("children", "shards_embedded", "rows", "plan")} == {
        k: retried[k] for k in ("children", "shards_embedded", "rows", "plan")
    }
    assert resumed["children_by_state"] == {"SUCCEEDED": 3}


def test_a_child_failing_every_attempt_fails_the_task_and_the_rerun_submits_its_shards_only(
    tmp_path: Path, executor: Any
):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    root = f"file://{tmp_path}"
    store = publish_tiny(root)
    write_corpus(store, CORPUS, rows=600, shards=6)
    op = array_operator(root, max_children=3)
    name = batch_job_name(op)
    for attempt in (1, 2, 3):  # retry_attempts=3: child 1 never gets through
        executor.fail(
            job_name=name, array_index=1, attempt=attempt, fault="exit", exit_code=75, after=0.1
        )
    with pytest.raises(AirflowException, match="transient") as info:
        op.execute({})
    assert not isinstance(info.value, AirflowFailException)  # Airflow retries it
    out = layout.embeddings("tiny", "v1", CORPUS)
    committed = [i for i in range(6) if store.exists(f"{out}/{commit_name(i)}")]
    assert committed == [0, 1, 4, 5]  # child 1 held shards 2 and 3

    summary = array_operator(root, max_children=3).execute({})
    assert len(executor.submits) == 2 and executor.submits[1]["arrayProperties"] == {"size": 2}
    assert summary["shards_embedded"] == 2 and summary["shards_reused"] == 4
    assert all(markers.verify(store, out, commit_name(i)).ok for i in range(6))


# --- the DAG's setting ----------------------------------------------------------------

ARRAY_ENV = {
    "EMBEDFRESH_EMBED_FAN_OUT": "array",
    "EMBEDFRESH_BATCH_JOB_QUEUE": "embed-queue",
    "EMBEDFRESH_BATCH_JOB_DEFINITION": "embedfresh-cpu",
    "EMBEDFRESH_EMBED_MAX_CHILDREN": "500",
}


def test_corpus_embeddings_as_one_array_job_task_when_so_deployed(tmp_path: Path):
    from tests.test_dag_integrity import parse_dags

    facts = parse_dags(tmp_path, ARRAY_ENV)
    assert facts["heavy_modules_loaded"] == []
    dag = facts["dags"]["corpus_embeddings"]
    assert {k: v["upstream"] for k, v in dag["tasks"].items()} == {
        "resolve_version": [],
        "embed": ["resolve_version"],
        "verify": ["embed"],
    }
    assert "max_children" in dag["tasks"]["embed"]["template_fields"]
    # Both the array job and the verifier (which reads every part) run on AWS Batch.
    import subprocess
    import sys

    from tests.conftest import ROOT, job_env

    probe = (
        "import json, runpy; dag = runpy.run_path('dags/corpus_embeddings.py')['dag']; "
        "print(json.dumps({t.task_id: [getattr(t, 'execution_mode', None), "
        "getattr(t, 'runner_settings', None)] for t in dag.tasks}))"
    )
    env = job_env({**ARRAY_ENV, "AIRFLOW_HOME": str(tmp_path / "home")})
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modes = json.loads(proc.stdout.strip().splitlines()[-1])
    batch = {"job_queue": "embed-queue", "job_definition": "embedfresh-cpu"}
    assert modes["embed"] == modes["verify"] == ["aws_batch", batch]
    assert modes["resolve_version"][0] is None
    assert dag["params"]["max_children"] == 500 and "shards_per_task" not in dag["params"]
    # The refresh fans its candidate's embed out the same way: one array job per corpus.
    refresh = facts["dags"]["embedding_model_refresh"]["tasks"]
    assert "list_shards" not in refresh
    assert refresh["embed"]["upstream"] == ["corpora"] and refresh["verify"]["upstream"] == [
        "corpora", "embed",
    ]  # fmt: skip
    assert refresh["embed"]["mode"] == "aws_batch" and refresh["embed"]["runner"] == batch


def test_array_fan_out_without_a_queue_is_an_import_error_naming_it(tmp_path: Path):
    from tests.test_dag_integrity import parse_dags

    env = {**ARRAY_ENV, "EMBEDFRESH_BATCH_JOB_QUEUE": ""}
    errors = parse_dags(tmp_path, env, allow_errors=True)["import_errors"]
    [message] = [m for f, m in errors.items() if f.endswith("corpus_embeddings.py")]
    assert "EMBEDFRESH_BATCH_JOB_QUEUE" in message
    bad = parse_dags(tmp_path, {"EMBEDFRESH_EMBED_FAN_OUT": "mapped-ish"}, allow_errors=True)
    assert any("mapped or array" in m for m in bad["import_errors"].values())


# --- docs/SCALING.md's figures ---------------------------------------------------------


def test_scaling_figures_in_the_doc_are_what_the_script_prints():
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "bench/scaling.py"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    text = (ROOT / "docs" / "SCALING.md").read_text()
    begin, end = "<!-- scaling-figures:begin -->\n", "<!-- scaling-figures:end -->"
    assert text[text.index(begin) + len(begin) : text.index(end)] == proc.stdout


def test_scaling_model_stays_under_the_limits_it_names(monkeypatch: pytest.MonkeyPatch):
    import importlib.util
    import sys

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("bench_scaling", ROOT / "bench" / "scaling.py")
    scaling = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, scaling)  # dataclasses look their module up
    spec.loader.exec_module(scaling)
    for rows in scaling.CORPORA:
        for max_children in (1, 1000, 10_000):
            c = scaling.corpus(rows, max_children)
            assert 1 <= c.children <= 10_000 and c.children * c.shards_per_child >= c.shards
            assert c.mapped_tasks <= scaling.MAX_MAP_LENGTH
    assert scaling.corpus(1_000_000_000, 10_000).shards_per_child == 10
    with pytest.raises(ValueError, match="at most 100000"):
        scaling.corpus(1_000_000_001)
    for device in scaling.devices():
        assert scaling.max_concurrent(device) >= scaling.MAX_CHILDREN_DEFAULT
