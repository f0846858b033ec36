"""Errors at the door: a model nobody published, a version or a corpus that does not
exist fails the run's first task (the refresh DAG's ``health``, the corpus DAG's
``resolve_version``) with a message naming it and what the store does hold, before any
job starts or anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from embedfresh.core import inputs
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.operators import AcceleratorHealthOperator, ResolveModelVersionOperator
from tests.airflow_home import promote_initial_version


def _listing(root: str) -> list[str]:
    store = ArtifactStore(root)
    return sorted(store.fs.find(store.path("")))


@pytest.fixture
def store_v1(root: str) -> str:
    """The generated data set (corpus ``products``) and tiny version v1 in production."""
    promote_initial_version(root, "v1")
    return root


def test_each_missing_input_is_named_with_what_exists(store_v1: str) -> None:
    store = ArtifactStore(store_v1)
    inputs.check_model(store, "tiny")  # a preset
    inputs.check_version(store, "tiny", "v1")
    inputs.check_corpus(store, "products")
    with pytest.raises(BadInputError, match=r"model 'acme' is not a preset .*models there: tiny"):
        inputs.check_model(store, "acme")
    with pytest.raises(
        BadInputError, match=r"version v9 of 'tiny' does not exist .*versions: v1\)"
    ):
        inputs.check_version(store, "tiny", "v9")
    with pytest.raises(BadInputError, match=r"corpus 'reviews' .*corpora there: products\)"):
        inputs.check_corpus(store, "reviews")


def test_the_refresh_dags_first_task_refuses_a_missing_corpus_or_model(store_v1: str) -> None:
    before = _listing(store_v1)
    health = AcceleratorHealthOperator(
        task_id="health", model="tiny", artifact_root=store_v1, check_inputs={"corpus": "reviews"}
    )
    with pytest.raises(AirflowFailException, match="corpus 'reviews'.*corpora there: products"):
        health.execute({})  # before any job process starts
    own = AcceleratorHealthOperator(
        task_id="health", artifact_root=store_v1, model="acme", check_inputs={"corpus": "products"}
    )
    with pytest.raises(AirflowFailException, match="python -m embedfresh.jobs.publish_model"):
        own.execute({})
    assert _listing(store_v1) == before
    with pytest.raises(ValueError, match="check_inputs takes corpus and version"):
        AcceleratorHealthOperator(
            task_id="h", model="tiny", artifact_root=store_v1, check_inputs={"dataset": "x"}
        )


def test_the_corpus_dags_first_task_refuses_a_missing_version_or_corpus(
    store_v1: str, tmp_path: Path
) -> None:
    resolve = ResolveModelVersionOperator(
        task_id="resolve_version", model="tiny", artifact_root=store_v1, corpus="products"
    )
    assert resolve.execute({}) == "v1"  # production
    missing = ResolveModelVersionOperator(
        task_id="resolve_version",
        model="tiny",
        artifact_root=store_v1,
        version="v9",
        corpus="products",
    )
    with pytest.raises(AirflowFailException, match=r"v9 of 'tiny' does not exist.*versions: v1"):
        missing.execute({})
    no_corpus = ResolveModelVersionOperator(
        task_id="resolve_version", model="tiny", artifact_root=store_v1, corpus="reviews"
    )
    with pytest.raises(AirflowFailException, match="corpora there: products"):
        no_corpus.execute({})
