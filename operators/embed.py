"""Batch embedding of a corpus with one model version, fanned out over corpus shards.

``ResolveModelVersionOperator`` (which version) -> ``CorpusShardsOperator`` (which shards,
as a list for dynamic task mapping) -> ``BatchEmbeddingOperator.partial(...).expand(
shards=...)`` -> ``EmbeddingVerifyOperator`` (counts against the corpus, manifest, Asset).
The first two run in the worker itself and stay light: no torch, only the artifact store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from embedfresh.operators.assets import (
    EMBEDDING_PUBLICATIONS_ALIAS,
    EMBEDDINGS_ASSET_URI,
    AssetAnnouncingOperator,
)
from embedfresh.operators.base import EmbedfreshJobOperator, FailFastTemplatesMixin
from embedfresh.operators.registry import production_version


class ResolveModelVersionOperator(FailFastTemplatesMixin, BaseOperator):
    """Returns ``version`` if given, else the registry's production version of ``model``;
    as a DAG's first task it checks them (and ``corpus``, if given) in the store, so a
    name that does not exist fails at once, naming what does.

    :param artifact_root: root URL of the artifact store (templated).
    :param model: model name (templated).
    :param version: explicit model version; empty means production (templated).
    :param corpus: a corpus the run will read, checked too; empty: none (templated).
    :raises AirflowFailException: no such version or corpus, or no production version.
    """

    template_fields: Sequence[str] = ("artifact_root", "model", "version", "corpus")
    ui_color = "#f0f0f0"

    def __init__(
        self,
        *,
        artifact_root: str,
        model: str = "tiny",
        version: str = "",
        corpus: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.artifact_root = artifact_root
        self.model = model
        self.version = version
        self.corpus = corpus

    def execute(self, context: Any) -> str:
        from embedfresh.core import inputs
        from embedfresh.core.exit_codes import BadInputError
        from embedfresh.core.storage import ArtifactStore

        version = self.version or production_version(self.artifact_root, self.model)
        self.log.info("version of %s: %s", self.model, version)
        store = ArtifactStore(self.artifact_root)
        try:
            inputs.check_version(store, self.model, version)
            if self.corpus:
                inputs.check_corpus(store, self.corpus)
        except BadInputError as e:
            raise AirflowFailException(str(e)) from e
        return version


class CorpusShardsOperator(FailFastTemplatesMixin, BaseOperator):
    """Lists a corpus's shard indices in chunks, the input of a mapped embed task.

    Returns e.g. ``[[0], [1], [2]]`` (``shards_per_task=1``) or ``[[0, 1], [2]]`` (2).

    :param artifact_root: root URL of the artifact store (templated).
    :param corpus: corpus name, ``corpora/<corpus>/part-NNNNN.parquet`` (templated).
    :param shards_per_task: shards one mapped embed task takes (templated).
    :raises AirflowFailException: the corpus has no shard.
    """

    template_fields: Sequence[str] = ("artifact_root", "corpus", "shards_per_task")
    ui_color = "#f0f0f0"

    def __init__(
        self,
        *,
        artifact_root: str,
        corpus: str = "products",
        shards_per_task: int | str = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.artifact_root = artifact_root
        self.corpus = corpus
        self.shards_per_task = shards_per_task

    def execute(self, context: Any) -> list[list[int]]:
        from embedfresh.core.exit_codes import BadInputError
        from embedfresh.core.shards import corpus_shards
        from embedfresh.core.storage import ArtifactStore

        k = int(self.shards_per_task)
        if k < 1:
            raise AirflowFailException(f"shards_per_task must be >= 1, got {k}")
        try:
            indices = list(corpus_shards(ArtifactStore(self.artifact_root), self.corpus))
        except BadInputError as e:
            raise AirflowFailException(str(e)) from e
        chunks = [indices[i : i + k] for i in range(0, len(indices), k)]
        self.log.info("corpus %s: %d shards in %d tasks", self.corpus, len(indices), len(chunks))
        return chunks


class _EmbedJobOperator(EmbedfreshJobOperator):
    template_fields: Sequence[str] = (*EmbedfreshJobOperator.template_fields, "version", "corpus")

    def __init__(self, *, version: str, corpus: str = "products", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.corpus = corpus

    def job_specific_settings(self) -> dict[str, Any]:
        return {"version": self.version, "corpus": self.corpus}


class BatchEmbeddingOperator(_EmbedJobOperator):
    """Embeds corpus shards with one committed model version (``python -m embedfresh.jobs.embed``).

    Skips shards already committed, so a retry only does what is left. Map it over
    shards: ``BatchEmbeddingOperator.partial(...).expand(shards=list_shards.output)``.

    :param version: model version to embed with (templated).
    :param corpus: corpus name (templated).
    :param shards: shard indices this task embeds; None: every shard (templated).
    :param token_budget: padded tokens per batch (templated).
    """

    job_name = "embed"
    template_fields: Sequence[str] = (*_EmbedJobOperator.template_fields, "shards", "token_budget")

    def __init__(
        self,
        *,
        shards: list[int] | str | None = None,
        token_budget: int | str = 4096,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.shards = shards
        self.token_budget = token_budget

    def job_specific_settings(self) -> dict[str, Any]:
        settings = {**super().job_specific_settings(), "token_budget": self.token_budget}
        if self.shards is not None:
            settings["shards"] = self.shards
        return settings


class EmbeddingVerifyOperator(AssetAnnouncingOperator, _EmbedJobOperator):
    """Verifies a corpus's embeddings and writes their manifest (``python -m embedfresh.jobs.embed_verify``).

    On success updates the Asset ``embedfresh://embeddings/<model>/<corpus>``: as a static
    outlet when both are plain strings, else through the Asset alias
    ``embedfresh-embedding-publications``. The event's extra holds the ``version``, the
    ``manifest`` URL and the ``rows``.

    :param version: model version the embeddings come from (templated).
    :param corpus: corpus name (templated).
    """

    job_name = "embed_verify"
    asset_alias = EMBEDDING_PUBLICATIONS_ALIAS
    asset_uri = EMBEDDINGS_ASSET_URI
    asset_defaults = {"model": "tiny", "corpus": "products"}
    asset_extra_keys = {"manifest": "manifest", "rows": "rows"}

    def asset_extra(self, summary: dict[str, Any]) -> dict[str, Any]:
        return {"version": self.version, **super().asset_extra(summary)}
