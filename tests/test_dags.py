"""Every DAG runs: ``dag.test()`` of each DAG file in ``dags/``, of each example DAG in
``tests/airflow/dags/`` (DAGs as another team's repository would write them) and of each
Python block of README.md and docs/**/*.md that creates a DAG, all found by discovery,
so a new DAG file or a new doc example is picked up without editing this test.

Each DAG runs in a fresh interpreter against a throw-away AIRFLOW_HOME
(tests/airflow_home.py), must succeed, then meets its own checks: :data:`CASES`, keyed by
dag id, says what data a DAG starts from, how it is triggered and what a run must have
done. A DAG without an entry fails, so nobody adds a DAG without saying what it must do.
The refresh's run is the session's golden run (tests/golden.py): this same run, made once
and shared with the tests that compare against it (tests/test_refresh_on_batch.py).

Doc examples run as written. One that names an ``s3://bucket/prefix`` root (the README's
``s3://my-bucket/embedfresh``) gets that bucket on a real S3 endpoint (moto's server on
127.0.0.1, reached over HTTP by the Airflow and job processes); one that names none reads
its root from ``EMBEDFRESH_ARTIFACT_ROOT`` or the ``artifact_root`` Param, which point at
a private ``file://`` store. Either way its case writes the data it needs there first.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core.settings import INDEX_DSN_ENV
from tests.airflow_home import (
    DAG_TEST_HELPERS,
    airflow_home,
    promote_initial_version,
    run_in_airflow,
)
from tests.conftest import DATA, DAY1, ROOT, write_data

# -- discovery ---------------------------------------------------------------------

#: Folders whose ``*.py`` files are DAG files: the project's, and the examples of DAGs
#: written outside the project.
DAG_FOLDERS = (ROOT / "dags", ROOT / "tests" / "airflow" / "dags")
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
S3_ROOT = re.compile(r"""["'](s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](?:/[^"'\s{}]*)?)["']""")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class DagSource:
    """One DAG to run: from a DAG file, or from a Python block of a doc."""

    label: str
    """The parameter id: ``dags/fleet_health.py``, ``README.md:reviews_embeddings``."""
    dag_id: str | None
    """None when the id is not a string literal in the source: the test says so."""
    code: str
    file: Path | None = None
    """The DAG file; None for a doc block (written to a file of its own to run)."""


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def dag_ids(code: str) -> list[str | None]:
    """The ids of the DAGs ``code`` creates, in source order: ``DAG("id", ...)``,
    ``DAG(dag_id="id")`` and ``@dag``-decorated functions (their name, or ``dag_id=``).
    None stands for a DAG whose id is not a string literal."""
    found: list[tuple[int, int, str | None]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and _name(node.func) == "DAG":
            kwargs = {k.arg: k.value for k in node.keywords}
            arg = node.args[0] if node.args else kwargs.get("dag_id")
            found.append((node.lineno, node.col_offset, _literal(arg)))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for dec in node.decorator_list:
                call = dec if isinstance(dec, ast.Call) else None
                if _name(call.func if call else dec) != "dag":
                    continue
                dag_id: str | None = node.name
                if call is not None:
                    kwargs = {k.arg: k.value for k in call.keywords}
                    if call.args or "dag_id" in kwargs:
                        dag_id = _literal(call.args[0] if call.args else kwargs["dag_id"])
                found.append((node.lineno, node.col_offset, dag_id))
    return [dag_id for _, _, dag_id in sorted(found, key=lambda f: f[:2])]


def _sources(label: str, code: str, file: Path | None) -> list[DagSource]:
    ids = dag_ids(code)
    if len(ids) == 1:
        return [DagSource(label, ids[0], code, file)]
    return [DagSource(f"{label}:{dag_id}", dag_id, code, file) for dag_id in ids]


def discover() -> list[DagSource]:
    """Every DAG file of :data:`DAG_FOLDERS` and every doc block that creates a DAG.

    A ``*.py`` file in a DAG folder is a DAG file when it holds "airflow" and "dag"
    (Airflow's own safe-mode test); one whose DAG cannot be found statically still
    becomes a parameter, which then fails saying why.
    """
    sources: list[DagSource] = []
    for folder in DAG_FOLDERS:
        for path in sorted(folder.glob("*.py")):
            code = path.read_text()
            if not {"airflow", "dag"} <= set(re.findall(r"airflow|dag", code.lower())):
                continue
            label = str(path.relative_to(ROOT))
            sources += _sources(label, code, path) or [DagSource(label, None, code, path)]
    for doc in doc_files():
        sources += doc_sources(str(doc.relative_to(ROOT)), doc.read_text())
    return sources


def doc_sources(label: str, text: str) -> list[DagSource]:
    """One source per DAG that a ```python block of the Markdown ``text`` creates,
    labelled ``<doc>:<dag_id>``; blocks that create none, or are no Python file (a
    console session), are not DAG examples."""
    sources = []
    for block in PYTHON_BLOCK.finditer(text):
        code = block.group(1)
        try:
            ids = dag_ids(code)
        except SyntaxError:
            continue
        sources += [DagSource(f"{label}:{dag_id}", dag_id, code) for dag_id in ids]
    return sources


SOURCES = discover()


def live_events(facts: dict) -> list:
    """The run's Asset events but those of embedding sets (what goes live)."""
    return [e for e in facts["asset_events"] if not e[0].startswith(SET_ASSET)]


def set_events(facts: dict) -> dict:
    """The run's embedding-set Asset events (a verified set, live or not): uri -> extra."""
    return {uri: extra for uri, extra in facts["asset_events"] if uri.startswith(SET_ASSET)}


SET_ASSET = "embedfresh://embedding-sets/"

# -- running one DAG -----------------------------------------------------------------

DAG_TEST = (
    DAG_TEST_HELPERS
    + r"""
path, dag_id, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kwargs = {"run_conf": spec["conf"]}
if spec["logical_date"]:
    kwargs["logical_date"] = dt.datetime.fromisoformat(spec["logical_date"])
run = load_dag(path, dag_id).test(**kwargs)
print(json.dumps(run_facts(run, spec["xcom_tasks"])))
"""
)


@dataclass(frozen=True)
class Run:
    """A finished ``dag.test()``: what :func:`run_facts` read back, the output tail, the
    artifact root it ran against."""

    facts: dict
    output: str
    root: str

    @property
    def artifacts(self) -> Path:
        """The local folder of a ``file://`` root."""
        assert self.root.startswith("file://"), self.root
        return Path(self.root.removeprefix("file://"))

    @property
    def reports(self) -> Path:
        return self.artifacts / "runs" / "tiny" / self.facts["run_id"] / "reports"


@dataclass(frozen=True)
class DagCase:
    """What one DAG starts from, how it is triggered, and what its run must have done."""

    check: Callable[[Run], None]
    """Asserts on a run that succeeded."""
    setup: Callable[[str], None] = lambda root: None
    """Writes what the DAG reads into the artifact root before the run."""
    conf: dict = field(default_factory=dict)
    """``run_conf`` on top of ``artifact_root``."""
    logical_date: str | None = None
    xcom_tasks: tuple[str, ...] = ()
    timeout: float = 300


def artifact_root(source: DagSource, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A private ``file://`` root, or the S3 root a doc example names, emptied, on moto."""
    named = sorted(set(S3_ROOT.findall(source.code))) if source.file is None else []
    if not named:
        return f"file://{tmp_path / 'artifacts'}"
    assert len(named) == 1, f"{source.label} names several S3 roots: {named}"
    import boto3

    endpoint = request.getfixturevalue("s3_endpoint")
    bucket, _, prefix = named[0].removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=endpoint)
    if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=bucket)
    prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])
    return named[0].rstrip("/")


def run_dag(
    source: DagSource,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    conf: dict | None = None,
) -> Run:
    """``dag.test()`` of ``source`` in a fresh interpreter and a fresh AIRFLOW_HOME whose
    DAGs folder holds the DAG file, after its case's setup; ``conf`` adds to its run_conf."""
    if source.dag_id is None:
        pytest.fail(f"{source.label}: no DAG with a string literal id found in it")
    case = CASES.get(source.dag_id)
    if case is None:
        pytest.fail(
            f"{source.label}: DAG {source.dag_id!r} has no checks: add a DagCase to CASES "
            "in tests/test_dags.py saying what a run of it must do"
        )
    root = artifact_root(source, tmp_path, request)
    case.setup(root)
    if source.file is None:
        dag_file = tmp_path / "dags" / f"{source.dag_id}.py"
        dag_file.parent.mkdir()
        dag_file.write_text(source.code)
    else:
        dag_file = source.file
    env = airflow_home(tmp_path / "airflow-home", root)
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dag_file.parent)
    spec = {
        "conf": {"artifact_root": root, **case.conf, **(conf or {})},
        "logical_date": case.logical_date,
        "xcom_tasks": list(case.xcom_tasks),
    }
    facts, output = run_in_airflow(
        DAG_TEST, env, str(dag_file), source.dag_id, json.dumps(spec), timeout=case.timeout
    )
    return Run(facts, output, root)


# -- the DAGs' own checks --------------------------------------------------------------

# dag.test() makes manual runs, which never train on their data interval: the training
# DAGs' cases name their day (2026-01-01, the first generated day, not the newest) in the
# conf. The logical date is the one a scheduled run of that day has.
DAY2_MIDNIGHT = "2026-01-02T00:00:00+00:00"
TRAIN_DAY = "2026-01-01"
SHARDS = DATA["corpus_rows"] // DATA["corpus_shard_rows"]


def with_production_v1(root: str) -> None:
    write_data(root)
    promote_initial_version(root, "v1")


def documented_xcom() -> dict[str, list[str]]:
    """docs/ARCHITECTURE.md's "One refresh, process by process" table: each task's XCom
    column, as the fields it names in backticks."""
    text = (ROOT / "docs/ARCHITECTURE.md").read_text()
    table = text[text.index("## One refresh, process by process") :]
    documented = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            task = cells[0].split("`")[1]
            documented[task] = re.findall(r"`([a-z_0-9]+)`", cells[4])
    return documented


def check_documented_xcom(xcom: dict) -> None:
    """Each task's XCom carries every field docs/ARCHITECTURE.md says it does."""
    documented = documented_xcom()
    assert set(documented) == set(xcom), (sorted(documented), sorted(xcom))
    wrong = []
    for task, fields in documented.items():
        value = xcom[task]
        if isinstance(value, list):  # a list XCom (corpora, list_shards): its items' fields
            value = value[0] if value and isinstance(value[0], dict) else {}
        keys = sorted(value) if isinstance(value, dict) else []
        # ... and the fields of the records a field lists (the gate's per-metric ones).
        for inner in value.values() if isinstance(value, dict) else []:
            if isinstance(inner, list) and inner and isinstance(inner[0], dict):
                keys += [k for k in inner[0] if k not in keys]
        if [f for f in fields if f not in keys]:
            wrong.append(f"{task}: documented {fields}, its XCom has {keys}")
    assert not wrong, "\n".join(wrong)


def check_embedding_model_refresh(run: Run) -> None:
    """Every task succeeds, from the health check to the release: the candidate embedded,
    verified, loaded into the vector index and search-checked before it went live."""
    facts, output, artifacts, reports = run.facts, run.output, run.artifacts, run.reports
    single = [
        "wait_for_partition", "health", "compile", "train", "evaluate", "gate", "gate_passed", "corpora",
        "list_shards", "release", "freshness",
    ]  # fmt: skip
    per_corpus = ["verify", "load_index", "search_check"]
    assert facts["tasks"] == sorted(
        [
            *([t, -1, "success"] for t in single),
            *([t, 0, "success"] for t in per_corpus),
            *(["embed", i, "success"] for i in range(SHARDS)),
        ]
    ), output

    check_documented_xcom(facts["xcom"])
    run_id = facts["run_id"]
    fresh = facts["xcom"]["freshness"]
    # The release just made trained through the run's own day: production is current.
    assert (fresh["production"], fresh["trained_through"]) == (run_id, "2026-01-02"), fresh
    assert (fresh["age_days"], fresh["stale"], fresh["held_by"]) == (0, False, []), fresh
    assert json.loads((reports / "health.json").read_text())["verdict"] == "PASS"
    assert json.loads((reports / "compile.json").read_text())["backend"] == "cpu"
    assert facts["xcom"]["health"]["verdict"] == "PASS"
    train = json.loads((reports / "train.json").read_text())
    # The data interval is the conf's day and epochs came from the Param default (3).
    assert train["data_interval"] == [TRAIN_DAY, "2026-01-02"]
    assert facts["xcom"]["train"]["steps"] == 96  # 1024 rows / batch 32 x 3 epochs
    assert facts["xcom"]["train"]["version"] == run_id
    assert json.loads((reports / "gate.json").read_text())["verdict"] == "PASS"
    # The run ended well inside its deadline: no breach recorded.
    assert not (reports / "deadline.json").exists()

    registry = json.loads((artifacts / "models" / "tiny" / "registry.json").read_text())
    assert registry["production"]["version"] == run_id
    assert registry["production"]["release"] == run_id
    registry_url = f"file://{artifacts}/models/tiny/registry.json"
    manifest = artifacts / "embeddings" / "tiny" / run_id / "products" / "_MANIFEST.json"
    release = json.loads(
        (artifacts / "models" / "tiny" / "releases" / f"{run_id}.json").read_text()
    )
    products = release["corpora"]["products"]
    assert products["embeddings"]["manifest"] == f"file://{manifest}"
    assert products["embeddings"]["rows"] == DATA["corpus_rows"]
    assert products["search_check"]["verdict"] == "PASS"
    # The embedded index under the artifact root holds the release's table, complete.
    from embedfresh.core.index import open_index

    with open_index(run.root) as index:
        assert index.count(products["index"]["table"]) == DATA["corpus_rows"]
        assert index.live_table("tiny", "products") == products["index"]["table"]
    assert set_events(facts) == {
        f"embedfresh://embedding-sets/tiny/{run_id}/products": {
            "rows": DATA["corpus_rows"], "manifest": f"file://{manifest}"
        }
    }  # fmt: skip
    assert live_events(facts) == [
        [
            "embedfresh://embeddings/tiny/products",
            {
                "release": run_id,
                "version": run_id,
                "table": products["index"]["table"],
                "rows": DATA["corpus_rows"],
                "manifest": f"file://{manifest}",
            },
        ],
        [
            "embedfresh://models/tiny",
            {"release": run_id, "version": run_id, "registry": registry_url},
        ],
    ]


def check_corpus_embeddings(run: Run) -> None:
    """The version resolved from the registry, one mapped embed task per corpus shard,
    the manifest; the set's own Asset event, not the live embeddings' (an embedding set
    goes live only with a release)."""
    facts, output = run.facts, run.output
    assert facts["tasks"] == sorted(
        [
            ["resolve_version", -1, "success"],
            ["list_shards", -1, "success"],
            ["verify", -1, "success"],
            *(["embed", i, "success"] for i in range(SHARDS)),
        ]
    ), output

    manifest_path = run.artifacts / "embeddings" / "tiny" / "v1" / "products" / "_MANIFEST.json"
    assert manifest_path.exists()
    assert live_events(facts) == [], output
    assert list(set_events(facts)) == ["embedfresh://embedding-sets/tiny/v1/products"], output


def with_v1_production_and_v2(root: str) -> None:
    """v1 live (a bare release), v2 committed but never gated: what an override releases."""
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.data.schema import DEMO_FEATURES
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    write_data(root)
    promote_initial_version(root, "v1")
    spec = get_spec("tiny").model_copy(update={"features": DEMO_FEATURES})
    weights = cpu_state_dict(versions.build_model(spec, 1))
    versions.publish(ArtifactStore(root), spec, "v2", weights, {})


def with_v2_after_v1(root: str) -> None:
    """Release r1 (v1, with products) then r2 (v2, with products): a rollback to r1 has
    its model, embeddings and index table to go back to (the embedded index)."""
    from tests.releasing import release_run

    with_v1_production_and_v2(root)
    for run_id, version in (("r1", "v1"), ("r2", "v2")):
        release_run(root, run_id, version=version, regression="report")


def check_promote_anyway(run: Run) -> None:
    """v2 embedded, verified, loaded and checked, then released by a person's override:
    the history says what, who (``dag_test`` under dag.test), why and from where; the
    model and embeddings Assets were updated together."""
    facts = run.facts
    per_corpus = ["verify", "load_index", "search_check"]
    assert facts["tasks"] == sorted(
        [
            *([t, -1, "success"] for t in ("corpora", "list_shards", "release")),
            *([t, 0, "success"] for t in per_corpus),
            *(["embed", i, "success"] for i in range(SHARDS)),
        ]
    ), run.output
    registry = json.loads((run.artifacts / "models/tiny/registry.json").read_text())
    entry = registry["history"][-1]
    assert registry["production"]["version"] == "v2" == entry["version"]
    assert entry["release"] == facts["run_id"] and entry["action"] == "promote_anyway"
    assert entry["previous"] == "v1" and entry["previous_release"] == "v1"
    assert entry["who"] == "dag_test" and entry["why"] == OVERRIDE_REASON
    check = json.loads((run.reports / "search-products.json").read_text())
    assert check["regression"].get("mode") == "report" or check["regression"]["verdict"] in (
        "NOT_COMPARED", "NOT_MEASURED",
    )  # fmt: skip
    assert [e[0] for e in live_events(facts)] == [
        "embedfresh://embeddings/tiny/products",
        "embedfresh://models/tiny",
    ], run.output


def check_rollback(run: Run) -> None:
    """The one task made release r1 live again, with its table; the history records who
    and why; the model and embeddings Assets name r1."""
    facts = run.facts
    assert facts["tasks"] == [["move", -1, "success"]], run.output
    registry = json.loads((run.artifacts / "models/tiny/registry.json").read_text())
    entry = registry["history"][-1]
    assert registry["production"]["release"] == "r1" == entry["release"]
    assert entry["version"] == "v1" and entry["previous_release"] == "r2"
    assert entry["action"] == "rollback" and entry["who"] == "dag_test"
    assert entry["why"] == OVERRIDE_REASON and entry["run_id"] == facts["run_id"]
    from embedfresh.core.index import open_index, table_name

    with open_index(run.root) as index:
        assert index.live_table("tiny", "products") == table_name("tiny", "r1", "products")
    events = dict(facts["asset_events"])
    assert events["embedfresh://models/tiny"]["release"] == "r1"
    assert events["embedfresh://embeddings/tiny/products"]["release"] == "r1"


OVERRIDE_REASON = "accepted by the team (ticket 7)"


def with_two_releases_and_a_third_bare(root: str) -> None:
    """Releases r1 (v1) and r2 (v2), both with products, then v1 again as bare r3; with
    retention 3 (the default) nothing is past it but the tables are all kept; the run
    is given retention 1 through the environment of the DAG run's jobs."""
    from embedfresh.core.storage import ArtifactStore
    from tests.releasing import bare_release

    with_v2_after_v1(root)
    bare_release(ArtifactStore(root), "tiny", "v1", "r3")


def check_garbage_collection(run: Run) -> None:
    """With the default retention (3 releases) and no grace, nothing kept is deleted:
    r1's and r2's tables and embeddings stay; the report lists the kept releases."""
    assert run.facts["tasks"] == [["collect", -1, "success"]], run.output
    report = json.loads((run.reports / "gc.json").read_text())
    assert report["kept_releases"] == ["r3", "r2", "r1"]
    assert report["tables_dropped"] == [] and report["embeddings_deleted"] == []
    assert (run.artifacts / "embeddings/tiny/v2/products/_MANIFEST.json").exists()


def with_a_release_and_a_change_set(root: str) -> None:
    """Release r1 (v1, with products), then a change set of the products corpus: three
    documents added (string texts in three scripts), one changed, two deleted."""
    from embedfresh.core.storage import ArtifactStore
    from tests.releasing import release_run
    from tests.reliability.test_fault_points import land_change_set

    with_production_v1(root)
    release_run(root, "r1", version="v1", regression="report")
    land_change_set(root)
    store = ArtifactStore(root)
    assert store.exists("corpora/products/changes/0001.parquet")


def check_corpus_sync(run: Run) -> None:
    """The sync task applied the change set to r1's table: the record's watermark is it,
    the table holds the corpus's 600 ids plus two added, less one deleted."""
    from embedfresh.core.storage import ArtifactStore

    assert run.facts["tasks"] == [["sync_products", -1, "success"]], run.output
    summary = run.facts["xcom"]["sync_products"]
    assert (summary["upserts_now"], summary["deletes_now"]) == (3, 1), summary
    record = ArtifactStore(run.root).read_json("models/tiny/sync/r1/products.json")
    assert record["watermark"] == "0001" and record["rows"] == DATA["corpus_rows"] + 1, record
    assert summary["rows"] == record["rows"] and summary["table"] == record["table"]


def check_fleet_health(run: Run) -> None:
    """With the defaults, the health job on cpu passes and its report lands under the run."""
    facts, output = run.facts, run.output
    assert facts["tasks"] == [["health", -1, "success"]], output
    report = json.loads((run.reports / "health.json").read_text())
    assert report["verdict"] == "PASS" and report["backend"] == "cpu"
    assert facts["xcom"]["health"]["verdict"] == "PASS"


def check_accelerator_parity(run: Run) -> None:
    """cpu against cpu from the production version, dropout 0 (the Param default), one
    epoch: the curves agree, PASS."""
    facts, output = run.facts, run.output
    tasks = ("init_version", "side_a", "side_b", "parity")
    assert facts["tasks"] == sorted([t, -1, "success"] for t in tasks), output
    gate = json.loads((run.reports / "gate.json").read_text())
    assert gate["verdict"] == "PASS", gate
    assert facts["xcom"]["parity"]["verdict"] == "PASS"
    # Both sides trained on the conf's day (cpu twice: run ids <run>-cpu-a and -b).
    for side in ("a", "b"):
        train = run.artifacts / "runs" / "tiny" / f"{facts['run_id']}-cpu-{side}" / "reports"
        interval = json.loads((train / "train.json").read_text())["data_interval"]
        assert interval == [TRAIN_DAY, "2026-01-02"], (side, interval)


DOCS_ROWS, DOCS_SHARD_ROWS = 96, 48


def with_two_corpora(root: str) -> None:
    """The products data set and corpus, and a second corpus, ``docs``, of two shards."""
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.generate import write_dataset

    write_data(root)
    write_dataset(
        ArtifactStore(root), "docs", 1, DAY1, 1, 32, 32, "docs", DOCS_ROWS, DOCS_SHARD_ROWS
    )


def check_reuse_operators(run: Run) -> None:
    """Another team's shape (health, train, evaluate under its own task id, two gates of
    different metrics and tolerances, two corpora embedded side by side from the
    candidate, no promote): every gate and embed has its own report, each XCom points at its own, the
    verified sets announce themselves and nothing goes live."""
    facts, output, artifacts = run.facts, run.output, run.artifacts
    tasks = ("health", "train", "evaluate_candidate", "wide_gate", "recall_gate")
    per_corpus = [f"{t}_{c}" for t in ("embed", "verify") for c in ("products", "docs")]
    assert facts["tasks"] == sorted([t, -1, "success"] for t in (*tasks, *per_corpus)), output
    run_id = facts["xcom"]["train"]["version"]
    reports = artifacts / "runs/tiny" / run_id / "reports"
    # The evaluation under its own task id, and each gate's decision in its own report.
    assert (reports / "eval-evaluate_candidate.json").exists() and not (
        reports / "eval.json"
    ).exists()
    gates = {}
    # Against the baseline (its relevance head never trained) recall@10 alone compares.
    for task, skipped in (("wide_gate", ["accuracy"]), ("recall_gate", [])):
        metrics = ["recall_at_10"]
        xcom = facts["xcom"][task]
        assert xcom["report"] == f"file://{reports / f'gate-{task}.json'}", xcom
        gates[task] = json.loads((reports / f"gate-{task}.json").read_text())
        assert [m["metric"] for m in gates[task]["metrics"]] == metrics
        assert [m["metric"] for m in xcom["metrics"]] == metrics
        assert list(xcom["metrics_not_compared"]) == skipped
        assert all(m["ci_low"] <= m["d"] <= m["ci_high"] for m in xcom["metrics"]), xcom
        assert xcom["verdict"] == gates[task]["verdict"] and xcom["candidate"] == run_id
        assert (reports / f"gate-{task}.svg").exists() and (
            reports / f"gate-{task}.vl.json"
        ).exists()
    assert not (reports / "gate.json").exists()
    # Each corpus embedded and verified into its own set, its report and XCom its own.
    for corpus, rows in (("products", DATA["corpus_rows"]), ("docs", DOCS_ROWS)):
        embed = json.loads((reports / f"embed-{corpus}.json").read_text())
        assert embed["corpus"] == corpus, embed
        manifest = artifacts / "embeddings/tiny" / run_id / corpus / "_MANIFEST.json"
        verified = facts["xcom"][f"verify_{corpus}"]
        assert verified["manifest"] == f"file://{manifest}" and verified["rows"] == rows
        assert json.loads(manifest.read_text())["rows"] == rows
    # The candidate's sets announce themselves; nothing live, no registry.
    assert live_events(facts) == [], output
    assert sorted(set_events(facts)) == [
        f"embedfresh://embedding-sets/tiny/{run_id}/docs",
        f"embedfresh://embedding-sets/tiny/{run_id}/products",
    ]
    assert not (artifacts / "models/tiny/registry.json").exists()


# The README's example: minilm's production version over a "reviews" corpus. Two shards
# of 24 rows keep minilm on CPU to seconds a task.
REVIEWS_ROWS, REVIEWS_SHARD_ROWS = 48, 24


def with_reviews_and_production_minilm(root: str) -> None:
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.generate import write_dataset

    store = ArtifactStore(root)
    write_dataset(store, "reviews", 0, DAY1, 1, 32, 32, "reviews", REVIEWS_ROWS, REVIEWS_SHARD_ROWS)
    promote_initial_version(root, "v1", "minilm")


def _table(store, rel: str, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(pa.BufferReader(store.read_bytes(rel)), columns=columns)


def check_reviews_embeddings(run: Run) -> None:
    """Health, minilm's production version from the registry, one mapped embed task per
    shard of the reviews corpus, verify: the embeddings in the store match the corpus,
    id for id. No live Asset event: an embedding set goes live only with a release."""
    from embedfresh.core.storage import ArtifactStore

    facts, output = run.facts, run.output
    shards = REVIEWS_ROWS // REVIEWS_SHARD_ROWS
    assert facts["tasks"] == sorted(
        [
            *([t, -1, "success"] for t in ("health", "version", "shards", "verify")),
            *(["embed", i, "success"] for i in range(shards)),
        ]
    ), output
    assert facts["xcom"]["health"]["verdict"] == "PASS", facts["xcom"]
    assert facts["xcom"]["version"] == "v1", facts["xcom"]

    store = ArtifactStore(run.root)
    out = "embeddings/minilm/v1/reviews"
    manifest = store.read_json(f"{out}/_MANIFEST.json")
    assert manifest["version"] == "v1"
    assert manifest["rows"] == REVIEWS_ROWS == facts["xcom"]["verify"]["rows"]
    corpus_ids = sorted(
        i
        for name in store.listdir("corpora/reviews")
        if name.startswith("part-")
        for i in _table(store, f"corpora/reviews/{name}", ["id"]).column("id").to_pylist()
    )
    assert len(corpus_ids) == REVIEWS_ROWS
    embedded = [_table(store, f"{out}/{name}") for name in sorted(manifest["parts"])]
    assert sorted(i for t in embedded for i in t.column("id").to_pylist()) == corpus_ids
    assert {v for t in embedded for v in t.column("model_version").to_pylist()} == {"v1"}
    assert live_events(facts) == [], output


CASES: dict[str, DagCase] = {
    "embedding_model_refresh": DagCase(
        check_embedding_model_refresh,
        setup=write_data,
        conf={"day": TRAIN_DAY},
        logical_date=DAY2_MIDNIGHT,
        xcom_tasks=(
            "wait_for_partition",
            "health",
            "compile",
            "train",
            "evaluate",
            "gate",
            "gate_passed",
            "corpora",
            "list_shards",
            "embed",
            "verify",
            "load_index",
            "search_check",
            "release",
            "freshness",
        ),
        timeout=400,
    ),
    "corpus_embeddings": DagCase(check_corpus_embeddings, setup=with_production_v1, timeout=240),
    "fleet_health": DagCase(check_fleet_health, xcom_tasks=("health",), timeout=240),
    "accelerator_parity": DagCase(
        check_accelerator_parity,
        setup=with_production_v1,
        conf={"backend_b": "cpu", "epochs": 1, "eval_every": 16, "day": TRAIN_DAY},
        logical_date=DAY2_MIDNIGHT,
        xcom_tasks=("parity",),
        timeout=400,
    ),
    "embedfresh_promote_anyway": DagCase(
        check_promote_anyway,
        setup=with_v1_production_and_v2,
        conf={"version": "v2", "reason": OVERRIDE_REASON},
        timeout=400,
    ),
    "embedfresh_rollback": DagCase(
        check_rollback,
        setup=with_v2_after_v1,
        conf={"release": "r1", "reason": OVERRIDE_REASON},
    ),
    "corpus_sync": DagCase(
        check_corpus_sync,
        setup=with_a_release_and_a_change_set,
        xcom_tasks=("sync_products",),
    ),
    "embedfresh_garbage_collection": DagCase(
        check_garbage_collection,
        setup=with_two_releases_and_a_third_bare,
        conf={"grace_hours": 0},
    ),
    "reuse_operators": DagCase(
        check_reuse_operators,
        setup=with_two_corpora,
        logical_date=DAY2_MIDNIGHT,
        xcom_tasks=(
            "train",
            "wide_gate",
            "recall_gate",
            "embed_products",
            "embed_docs",
            "verify_products",
            "verify_docs",
        ),
        timeout=400,
    ),
    "reviews_embeddings": DagCase(
        check_reviews_embeddings,
        setup=with_reviews_and_production_minilm,
        xcom_tasks=("health", "version", "verify"),
        timeout=400,
    ),
}

# -- the tests ---------------------------------------------------------------------------

#: The source whose run is the session's golden run (tests/golden.py).
GOLDEN_LABEL = "dags/embedding_model_refresh.py"


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """The session's golden run (fixture ``golden_refresh``) for the refresh's source,
    made in the test's setup where it is the first to ask; None for any other source."""
    source = getattr(request.node, "callspec", None) and request.node.callspec.params["source"]
    if source and source.label == GOLDEN_LABEL:
        return request.getfixturevalue("golden_refresh")
    return None


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=[s.label for s in SOURCES])
def test_dag_runs_to_success_and_does_its_job(
    source: DagSource, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch, golden
):
    if golden is not None:
        # The refresh is the session's golden run (tests/golden.py: this same run_dag of
        # this case, its index a database of the session's PostgreSQL), shared with the
        # tests that compare against it; the check reads that index.
        monkeypatch.setenv(INDEX_DSN_ENV, golden.dsn)
        run = golden.run
    else:
        run = run_dag(source, tmp_path, request)
    assert run.facts["state"] == "success", run.output
    CASES[source.dag_id].check(run)


@pytest.mark.slow
def test_fleet_health_fails_an_impossible_threshold_without_retry(
    tmp_path: Path, request: pytest.FixtureRequest
):
    # No single CPU shows 10 devices: the Param reaches the job, which exits 4.
    (source,) = [s for s in SOURCES if s.dag_id == "fleet_health"]
    run = run_dag(source, tmp_path, request, conf={"expected_devices": 10})
    facts, output = run.facts, run.output
    assert facts["state"] == "failed", output
    assert facts["tasks"] == [["health", -1, "failed"]], output
    report = json.loads((run.reports / "health.json").read_text())
    assert report["verdict"] == "FAIL" and report["failed"], report
    assert "exit code 4" in output


def test_discovery_finds_every_dag_file_and_doc_example():
    labels = [s.label for s in SOURCES]
    assert len(labels) == len(set(labels)), labels
    # Every DAG file of dags/, the example of another team's DAG, the README's example.
    dag_files = {str(p.relative_to(ROOT)) for p in (ROOT / "dags").glob("*.py")}
    # (a file with several DAGs gives one label per DAG: ``<file>:<dag_id>``)
    assert dag_files and dag_files <= {label.split(":")[0] for label in labels}, labels
    assert {"tests/airflow/dags/reuse_operators.py", "README.md:reviews_embeddings"} <= set(
        labels
    ), labels
    # Every DAG has its checks and every check has its DAG: no stale entry in CASES.
    assert sorted(s.dag_id or "" for s in SOURCES) == sorted(CASES), labels


def test_dag_ids_are_read_from_dag_calls_and_dag_decorators():
    code = """
from airflow.sdk import DAG, dag
import airflow.sdk as sdk

with DAG("first", schedule=None):
    pass
second = sdk.DAG(dag_id="second")

@dag
def third():
    pass

@dag(dag_id="fourth", schedule=None)
def not_the_id():
    pass

DAG(dag_id=name_from_elsewhere)
"""
    assert dag_ids(code) == ["first", "second", "third", "fourth", None]
    assert dag_ids("x = 1\nprint(x)\n") == []


def test_doc_blocks_become_one_source_per_dag_and_name_their_s3_root():
    doc = "text\n```python\nROOT = 's3://my-bucket/p'\nwith DAG('a'):\n    pass\n```\n"
    doc += "```python\nimport x\n```\n```python\n>>> DAG('console')\n```\n"
    doc += "```bash\nDAG('no')\n```\n```python\nDAG('b')\nDAG(dag_id='c')\n```\n"
    sources = doc_sources("doc.md", doc)
    assert [(s.label, s.dag_id) for s in sources] == [
        ("doc.md:a", "a"),
        ("doc.md:b", "b"),
        ("doc.md:c", "c"),
    ]
    assert all(s.file is None for s in sources)
    assert S3_ROOT.findall(sources[0].code) == ["s3://my-bucket/p"]
    assert S3_ROOT.findall(sources[1].code) == []
