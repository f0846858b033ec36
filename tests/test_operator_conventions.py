"""The job operators follow Airflow's conventions, so another team's DAG can reuse them.

Identity arguments are required (never the demo's model); a settings typo is a DAG
import error, or a failure without retry once rendered; ``deferrable`` defaults from
``[operators] default_deferrable`` and ``aws_conn_id`` is an operator argument; the task
links to its AWS Batch job (the Amazon provider's own links, stored as the provider's
``BatchOperator`` stores them) and to the model's "Model quality" page; the datasets a
job read and wrote are given to OpenLineage when its provider is installed; the
store the control plane reads takes an Airflow connection; and a renamed operator's old
name keeps working, with a warning, for one release.
"""

from __future__ import annotations

import datetime as dt
import json
import pydoc
import re
import sys
import types
import warnings
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from embedfresh.connections import s3_storage_options
from embedfresh.core.config import EvaluateConfig, JobConfig
from embedfresh.core.results import ResultTicket, write_result
from embedfresh.core.settings import ARTIFACT_ROOT_ENV
from embedfresh.operators import (
    AcceleratorHealthOperator,
    EmbedfreshJobOperator,
    EvaluationOperator,
    JobSpec,
    ShardEmbeddingOperator,
)
from embedfresh.operators.base import JOB_CONFIGS, SettingsError
from embedfresh.operators.lineage import DatasetRef, job_datasets, operator_lineage
from embedfresh.operators.links import MODEL_QUALITY_PATH, ModelQualityLink, model_quality_url
from embedfresh.operators.store import connection_scope
from tests.conftest import ROOT

BATCH = {"job_definition": "embedfresh-train", "job_queue": "embedfresh-queue"}


def evaluation(**kwargs: Any) -> EvaluationOperator:
    return EvaluationOperator(**{"task_id": "evaluate", "model": "minilm", **kwargs})


# --- identity arguments ---------------------------------------------------------------


def test_a_forgotten_model_fails_the_dag_file_naming_it_never_the_demos():
    with pytest.raises(TypeError, match="missing keyword argument 'model'"):
        EvaluationOperator(task_id="e", artifact_root="file:///r")
    # A mapped task's arguments reach its __init__ only when it runs: partial asks now.
    with DAG("d", schedule=None):
        with pytest.raises(TypeError, match="partial.*missing keyword argument 'model'"):
            ShardEmbeddingOperator.partial(task_id="embed", version="v1", corpus="docs")
        ShardEmbeddingOperator.partial(
            task_id="ok", model="minilm", version="v1", corpus="docs"
        ).expand(shards=[[0], [1]])
    with DAG("defaults", schedule=None, default_args={"model": "minilm"}):
        ShardEmbeddingOperator.partial(task_id="embed", version="v1", corpus="d").expand(
            shards=[[0]]
        )
    for bad in ("", "a/b", "../x"):
        with pytest.raises(ValueError, match="model"):
            evaluation(model=bad)
    assert evaluation(model="{{ params.model }}").model == "{{ params.model }}"


def test_the_artifact_root_defaults_to_the_jobs_setting_when_the_dag_file_parses(monkeypatch):
    monkeypatch.setenv(ARTIFACT_ROOT_ENV, "s3://bucket/from-env")
    op = evaluation()
    assert op.artifact_root == "s3://bucket/from-env" == JobConfig().artifact_root
    monkeypatch.setenv(ARTIFACT_ROOT_ENV, "s3://bucket/later")
    assert op.artifact_root == "s3://bucket/from-env"  # read at parse time, not per run
    assert evaluation(artifact_root="file:///mine").artifact_root == "file:///mine"


def test_job_configs_name_each_jobs_own_config():
    """:data:`JOB_CONFIGS` (what job_settings are checked against) agrees with every
    job's ``main_for(name, Config, ...)``, read from the source, not imported."""
    found = {}
    for path in sorted((ROOT / "embedfresh/jobs").glob("*.py")):
        for job, config in re.findall(r'main_for\(\s*"(\w+)",\s*(\w+)', path.read_text()):
            found[job] = config
    assert found == dict(JOB_CONFIGS)


# --- settings typos: parse time, or no retry ------------------------------------------


def test_a_job_settings_typo_is_a_dag_import_error():
    with pytest.raises(ValueError, match=r"unknown settings \['batch_sise'\] for job 'evaluate'"):
        evaluation(job_settings={"batch_sise": 8})
    assert evaluation(job_settings={"batch_size": "{{ params.b }}"}).job_settings
    # A mapped task is unmapped when it runs: the same error, then without retry.
    with DAG("m", schedule=None):
        mapped = ShardEmbeddingOperator.partial(
            task_id="embed", model="minilm", version="v1", corpus="docs",
            job_settings={"tokn_budget": 1024},
        ).expand(shards=[[0]])  # fmt: skip
    with pytest.raises(AirflowFailException, match="tokn_budget"):
        mapped.unmap({"shards": [0]})


def test_a_batch_settings_typo_is_a_dag_import_error_even_beside_templates():
    with pytest.raises(ValueError, match=r"unknown settings \['num_node'\] for execution_mode"):
        evaluation(execution_mode="aws_batch", batch={**BATCH, "num_node": 2})
    with pytest.raises(ValueError, match=r"unknown settings \['num_node'\]"):
        evaluation(
            execution_mode="aws_batch",
            batch={**BATCH, "job_queue": "{{ params.queue }}", "num_node": 2},
        )
    with pytest.raises(ValueError, match=r"needs the settings \['job_queue'\]"):
        evaluation(execution_mode="aws_batch", batch={"job_definition": "d"})
    with pytest.raises(ValueError, match="num_nodes must be >= 1"):
        evaluation(execution_mode="aws_batch", batch={**BATCH, "num_nodes": 0})
    with pytest.raises(ValueError, match=r"unknown settings \['kill_grace'\]"):
        evaluation(runner_settings={"kill_grace": 3})  # the local runner's too


def test_rendered_settings_that_do_not_validate_fail_the_task_without_retry(tmp_path):
    op = evaluation(
        artifact_root=f"file://{tmp_path}",
        execution_mode="aws_batch",
        batch={**BATCH, "num_nodes": "{{ params.nodes }}"},
    )  # parses: a template is checked once rendered
    op.runner_settings = {**BATCH, "num_nodes": 0}  # as rendered
    with pytest.raises(AirflowFailException, match="num_nodes must be >= 1.*not retrying"):
        op.execute({})
    whole = evaluation(artifact_root=f"file://{tmp_path}", runner_settings="{{ params.r }}")
    whole.runner_settings = {"kill_grace": 3}
    with pytest.raises(AirflowFailException, match=r"unknown settings \['kill_grace'\]"):
        whole.execute({})
    settings = evaluation(job_settings="{{ params.settings }}")
    settings.job_settings = {"batch_sise": 8}
    with pytest.raises(AirflowFailException, match=r"unknown settings \['batch_sise'\]"):
        settings.execute({})
    assert not list(tmp_path.iterdir())  # nothing ran, nothing was written
    assert issubclass(SettingsError, ValueError) and issubclass(SettingsError, AirflowFailException)


# --- deferrable and aws_conn_id ---------------------------------------------------------


def test_deferrable_defaults_from_airflows_setting(monkeypatch: pytest.MonkeyPatch):
    assert evaluation(execution_mode="aws_batch", batch=BATCH).runner.deferrable is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "true")
    op = evaluation(execution_mode="aws_batch", batch=BATCH)
    assert op.deferrable is True and op.runner.deferrable is True
    assert (
        evaluation(execution_mode="aws_batch", batch=BATCH, deferrable=False).runner.deferrable
        is False
    )
    legacy = evaluation(execution_mode="aws_batch", batch={**BATCH, "deferrable": False})
    assert legacy.deferrable is False and legacy.runner.deferrable is False
    with pytest.raises(ValueError, match="deferrable given twice"):
        evaluation(
            execution_mode="aws_batch", batch={**BATCH, "deferrable": True}, deferrable=False
        )
    local = evaluation(deferrable=True)  # a runner that cannot defer is not given it
    assert local.runner.__class__.__name__ == "LocalRunner"


def test_aws_conn_id_is_an_operator_argument_passed_to_the_batch_runner():
    op = evaluation(execution_mode="aws_batch", batch=BATCH, aws_conn_id="prod_aws")
    assert op.aws_conn_id == "prod_aws" and op.runner.settings.aws_conn_id == "prod_aws"
    assert "aws_conn_id" in op.template_fields
    assert evaluation(execution_mode="aws_batch", batch=BATCH).runner.settings.aws_conn_id == (
        "aws_default"
    )
    none = evaluation(execution_mode="aws_batch", batch=BATCH, aws_conn_id=None)
    assert none.runner.settings.aws_conn_id is None  # boto3's own credentials
    legacy = evaluation(execution_mode="aws_batch", batch={**BATCH, "aws_conn_id": "old"})
    assert legacy.aws_conn_id == "old" and legacy.runner.settings.aws_conn_id == "old"
    same = evaluation(
        execution_mode="aws_batch", batch={**BATCH, "aws_conn_id": "a"}, aws_conn_id="a"
    )
    assert same.runner.settings.aws_conn_id == "a"
    with pytest.raises(ValueError, match="aws_conn_id given twice, 'a' and 'b'"):
        evaluation(execution_mode="aws_batch", batch={**BATCH, "aws_conn_id": "b"}, aws_conn_id="a")
    # Rendered: the operator's own (templated) value is what the runner gets.
    templated = evaluation(execution_mode="aws_batch", batch=BATCH, aws_conn_id="{{ params.conn }}")
    templated.aws_conn_id = "rendered_conn"
    assert templated.runner.settings.aws_conn_id == "rendered_conn"


def test_the_operator_reads_an_s3_store_through_its_aws_connection(s3_endpoint, monkeypatch):
    """Only the connection knows the endpoint: with it the result record is read, without
    it the same read goes where the environment points (nowhere) and fails."""
    import boto3

    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="conventions")
    root = "s3://conventions/prod"
    connection = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_STORE_S3", json.dumps(connection))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert s3_storage_options("file:///x", "store_s3") is None  # no lookup at all
    assert s3_storage_options(root, "store_s3")["endpoint_url"] == s3_endpoint
    with connection_scope(root, "store_s3"):
        write_result(
            JobConfig(artifact_root=root, model="minilm", run_id="r1"),
            job="evaluate", name="evaluate", attempt_id="a1", summary={"status": "ok"},
            started_at=dt.datetime.now(dt.UTC),
        )  # fmt: skip
    ticket = ResultTicket(name="evaluate", attempt_id="a1")
    op = evaluation(artifact_root=root, run_id="r1", aws_conn_id="store_s3")
    assert op.read_result(op.build_job_spec(ticket)) == {"status": "ok"}
    blind = evaluation(artifact_root=root, run_id="r1", aws_conn_id=None)
    with pytest.raises(AirflowException):
        blind.read_result(blind.build_job_spec(ticket))


def test_the_model_quality_page_reads_its_store_through_the_configured_connection(
    s3_endpoint, monkeypatch
):
    from embedfresh.plugins.model_quality import settings

    monkeypatch.delenv(settings.AWS_CONN_ID_ENV, raising=False)
    assert settings.storage_options("s3://b/p") is None  # none configured: boto3's own
    monkeypatch.setenv(settings.AWS_CONN_ID_ENV, "ui_s3")
    extra = {"endpoint_url": s3_endpoint, "config_kwargs": {"connect_timeout": 3}}
    monkeypatch.setenv("AIRFLOW_CONN_UI_S3", json.dumps({"conn_type": "aws", "extra": extra}))
    options = settings.storage_options("s3://b/p")
    assert options["endpoint_url"] == s3_endpoint
    assert options["config_kwargs"] == {"connect_timeout": 3}
    assert settings.storage_options("file:///local") is None


# --- extra links --------------------------------------------------------------------------


def test_extra_links_are_the_providers_batch_links_and_the_model_quality_page():
    from airflow.providers.amazon.aws.links.batch import (
        BatchJobDefinitionLink,
        BatchJobDetailsLink,
        BatchJobQueueLink,
    )
    from airflow.providers.amazon.aws.links.logs import CloudWatchEventsLink
    from airflow.serialization.serialized_objects import OperatorSerialization

    from embedfresh.plugins.model_quality.settings import URL_PREFIX

    kinds = [type(link) for link in EmbedfreshJobOperator.operator_extra_links]
    assert kinds == [
        ModelQualityLink, BatchJobDetailsLink, BatchJobDefinitionLink, BatchJobQueueLink,
        CloudWatchEventsLink,
    ]  # fmt: skip
    # What the DAG processor stores for the UI: each link's name and XCom key. A task
    # that does not run on Batch has only the page: Airflow computes every link when a
    # task ends, and each AWS link it cannot find logs an error in the task's log.
    on_batch = evaluation(execution_mode="aws_batch", batch=BATCH)
    assert OperatorSerialization.serialize_operator(on_batch)["_operator_extra_links"] == {
        "Model quality": "_link_ModelQualityLink",
        "Batch Job Details": "_link_BatchJobDetailsLink",
        "Batch Job Definition": "_link_BatchJobDefinitionLink",
        "Batch Job Queue": "_link_BatchJobQueueLink",
        "CloudWatch Events": "_link_CloudWatchEventsLink",
    }
    local = OperatorSerialization.serialize_operator(evaluation())
    assert local["_operator_extra_links"] == {"Model quality": "_link_ModelQualityLink"}
    assert MODEL_QUALITY_PATH == URL_PREFIX
    link = ModelQualityLink()
    assert link.get_link(evaluation(model="team:e5+v2"), ti_key=None) == (
        "/model-quality/?model=team%3Ae5%2Bv2"
    )
    assert link.get_link(evaluation(model="{{ params.model }}"), ti_key=None) == ""
    assert model_quality_url("minilm", "https://airflow.example.com/") == (
        "https://airflow.example.com/model-quality/?model=minilm"
    )


def test_the_base_url_comes_from_airflows_api_setting(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com")
    assert ModelQualityLink().get_link(evaluation(), ti_key=None) == (
        "https://airflow.example.com/model-quality/?model=minilm"
    )


class RecordingTI:
    """A task instance that keeps what the links persist (``xcom_push``)."""

    task_id, dag_id, map_index = "health", "conventions", -1

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


@pytest.fixture
def batch(monkeypatch: pytest.MonkeyPatch):
    from tests.batch_harness import moto_batch

    yield from moto_batch(monkeypatch)


def test_a_batch_job_task_stores_the_providers_links_as_batch_operator_does(batch, tmp_path):
    from airflow.providers.amazon.aws.links.batch import (
        BatchJobDefinitionLink,
        BatchJobDetailsLink,
        BatchJobQueueLink,
    )

    from tests.batch_harness import settings

    op = AcceleratorHealthOperator(
        task_id="health", model="tiny", artifact_root=f"file://{tmp_path}", run_id="r1",
        execution_mode="aws_batch", runner_settings=settings(),
    )  # fmt: skip
    ti = RecordingTI()
    # Moto ends the job at once without running it: no result record, a retryable error,
    # after the links were stored.
    with pytest.raises(AirflowException, match="wrote no result record"):
        op.execute({"ti": ti})
    job_id = op.runner.job_id
    details = ti.xcom["batch_job_details"]
    assert details["job_id"] == job_id and details["region_name"] == "us-east-1"
    assert details["aws_domain"] == "aws.amazon.com"
    assert job_id in BatchJobDetailsLink().format_link(**details)
    queue = BatchJobQueueLink().format_link(**ti.xcom["batch_job_queue"])
    definition = BatchJobDefinitionLink().format_link(**ti.xcom["batch_job_definition"])
    assert "embedfresh-queue" in queue and "embedfresh-train" in definition


# --- OpenLineage --------------------------------------------------------------------------


def test_lineage_names_store_urls_and_index_tables_as_openlineage_does():
    settings = {
        "artifact_root": "s3://bucket/prod", "model": "minilm", "run_id": "r1",
        "version": "v7", "corpus": "docs",
    }  # fmt: skip
    embed = job_datasets("embed", settings)
    assert embed.inputs == (
        DatasetRef("s3://bucket", "prod/models/minilm/versions/v7"),
        DatasetRef("s3://bucket", "prod/corpora/docs"),
    )
    assert embed.outputs == (DatasetRef("s3://bucket", "prod/embeddings/minilm/v7/docs"),)
    summary = {
        "table": "emb_minilm_v7_docs",
        "index": {"location": "postgresql://loader@db.example:6543/vectors"},
        "report": "s3://bucket/prod/runs/minilm/r1/reports/index-docs.json",
    }
    load = job_datasets("index_load", settings, summary)
    assert load.inputs == (DatasetRef("s3://bucket", "prod/embeddings/minilm/v7/docs"),)
    assert load.outputs == (
        DatasetRef("postgres://db.example:6543", "vectors.embedfresh.emb_minilm_v7_docs"),
        DatasetRef("s3://bucket", "prod/runs/minilm/r1/reports/index-docs.json"),
    )
    release = job_datasets(
        "release",
        {"artifact_root": "file:///srv/store", "model": "minilm", "run_id": "r1"},
        {"corpora": {"docs": {"manifest": "file:///srv/store/embeddings/minilm/v7/docs/_MANIFEST.json"}},
         "release_url": "file:///srv/store/models/minilm/releases/r1.json"},
    )  # fmt: skip
    assert release.inputs == (DatasetRef("file", "/srv/store/embeddings/minilm/v7/docs"),)
    assert release.outputs == (
        DatasetRef("file", "/srv/store/models/minilm/registry.json"),
        DatasetRef("file", "/srv/store/models/minilm/releases/r1.json"),
    )


def test_an_operators_lineage_fills_in_its_jobs_defaults():
    op = evaluation(artifact_root="s3://bucket/prod", run_id="r1")
    lineage = op.lineage(op.build_job_spec(), {"report": "s3://bucket/prod/x/eval.json"})
    assert lineage.inputs == (
        DatasetRef("s3://bucket", "prod/models/minilm/versions/r1"),  # version: the run's
        DatasetRef("s3://bucket", f"prod/datasets/{EvaluateConfig().dataset}/eval"),
    )
    assert lineage.outputs == (DatasetRef("s3://bucket", "prod/x/eval.json"),)


def test_lineage_reaches_openlineage_only_through_its_provider(monkeypatch):
    lineage = job_datasets(
        "embed", {"artifact_root": "file:///s", "model": "m", "version": "v", "corpus": "c"}
    )
    try:
        import airflow.providers.openlineage  # noqa: F401
    except ImportError:  # not installed here: nothing is reported, nothing fails
        assert operator_lineage(lineage) is None
        op = evaluation()
        op._lineage = lineage
        assert op.get_openlineage_facets_on_complete(None) is None
    # The provider's side, as it would be given: OperatorLineage of Dataset objects.
    extractors = types.ModuleType("airflow.providers.openlineage.extractors")
    facet = types.ModuleType("airflow.providers.common.compat.openlineage.facet")
    extractors.OperatorLineage = lambda inputs, outputs: ("lineage", inputs, outputs)
    facet.Dataset = lambda namespace, name: (namespace, name)
    monkeypatch.setitem(sys.modules, extractors.__name__, extractors)
    monkeypatch.setitem(sys.modules, facet.__name__, facet)
    assert operator_lineage(lineage) == (
        "lineage",
        [("file", "/s/models/m/versions/v"), ("file", "/s/corpora/c")],
        [("file", "/s/embeddings/m/v/c")],
    )
    assert evaluation().get_openlineage_facets_on_complete(None) is None  # nothing ran


# --- renamed operators: the old name for one release ------------------------------------


def test_batch_embedding_operator_is_a_deprecated_alias_that_builds_the_same_operator():
    """``BatchEmbeddingOperator`` embeds on any runner, not only AWS Batch: it is
    ``ShardEmbeddingOperator`` now. The old name is importable from both paths for one
    release, warns naming the new one where a DAG uses it (constructed, or ``partial``)
    but not where it is imported, and builds the same job."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # importing the old name does not warn
        from embedfresh.operators import BatchEmbeddingOperator
        from embedfresh.operators.embed import BatchEmbeddingOperator as from_embed
    import embedfresh.operators

    assert from_embed is BatchEmbeddingOperator
    assert "BatchEmbeddingOperator" in embedfresh.operators.__all__
    assert "ShardEmbeddingOperator" in embedfresh.operators.__all__
    args = {
        "task_id": "embed", "artifact_root": "file:///r", "model": "minilm", "run_id": "r1",
        "version": "v1", "corpus": "docs", "shards": [0, 2], "token_budget": 1024,
    }  # fmt: skip
    renamed = r"BatchEmbeddingOperator is deprecated.*use ShardEmbeddingOperator"
    with pytest.warns(FutureWarning, match=renamed) as record:
        old = BatchEmbeddingOperator(**args)
    # Attributed to the line that used the old name, not to Airflow's __init__ wrapper.
    assert [w.filename for w in record if "BatchEmbeddingOperator" in str(w.message)] == [__file__]
    new = ShardEmbeddingOperator(**args)
    assert isinstance(old, ShardEmbeddingOperator)
    assert old.build_job_spec() == new.build_job_spec()
    assert old.template_fields == new.template_fields and old.job_name == new.job_name == "embed"
    # A mapped task: partial warns while the DAG file parses, and the task it unmaps to
    # runs the same job as the new name's.
    with DAG("renamed", schedule=None):
        with pytest.warns(FutureWarning, match=renamed) as record:
            mapped = BatchEmbeddingOperator.partial(
                task_id="embed", model="minilm", version="v1", corpus="docs"
            ).expand(shards=[[0], [1]])
        assert [w.filename for w in record if "BatchEmbeddingOperator" in str(w.message)] == [
            __file__
        ]
        fresh = ShardEmbeddingOperator.partial(
            task_id="fresh", model="minilm", version="v1", corpus="docs"
        ).expand(shards=[[0], [1]])
    with pytest.warns(FutureWarning, match=renamed):
        unmapped = mapped.unmap({"shards": [1]})
    assert isinstance(unmapped, ShardEmbeddingOperator)
    assert unmapped.job_specific_settings() == fresh.unmap({"shards": [1]}).job_specific_settings()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name never warns
        ShardEmbeddingOperator(**args)


# --- documentation ----------------------------------------------------------------------


def test_help_shows_the_installed_import_path():
    import embedfresh.operators

    text = pydoc.render_doc(embedfresh.operators, renderer=pydoc.plaintext)
    assert "from embedfresh.operators import" in text
    assert not re.search(r"(?<![\w.])from operators import", text)


def test_a_spec_without_a_known_job_is_not_checked():
    """A job the operators do not know (a team's own) keeps its settings unchecked here;
    its own config refuses what it does not take."""

    class OwnJob(EmbedfreshJobOperator):
        job_name = "own_job"

    op = OwnJob(task_id="own", model="minilm", job_settings={"anything": 1})
    spec = op.build_job_spec()
    assert isinstance(spec, JobSpec) and spec.settings["anything"] == 1
