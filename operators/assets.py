"""The Assets a release announces (:mod:`embedfresh.operators.release`): the model and,
for each corpus it carries, the corpus's embeddings; and the Asset of a candidate's
embedding set, announced when it is verified (never the live one).

An operator whose Asset depends on templated arguments (``"{{ params.model }}"``) cannot
name it when the DAG is parsed: it then emits through an :class:`~airflow.sdk.AssetAlias`
and adds the concrete Asset at run time. With plain strings the Asset is a static outlet.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset

#: Alias a release or rollback emits model Assets through when the model is only known
#: at run time (templated), e.g. ``"{{ params.model }}"``.
MODEL_PROMOTIONS_ALIAS = "embedfresh-model-promotions"

#: Alias a release or rollback emits the embedding Assets of its corpora through.
EMBEDDING_PUBLICATIONS_ALIAS = "embedfresh-embedding-publications"

#: Alias a verify task emits its embedding set's Asset through (model, version and corpus
#: are known at run time).
EMBEDDING_SETS_ALIAS = "embedfresh-embedding-sets"

MODEL_ASSET_URI = "embedfresh://models/{model}"
EMBEDDINGS_ASSET_URI = "embedfresh://embeddings/{model}/{corpus}"
EMBEDDING_SET_ASSET_URI = "embedfresh://embedding-sets/{model}/{version}/{corpus}"
CORPUS_ASSET_URI = "embedfresh://corpora/{corpus}"


def model_asset(model: str) -> Asset:
    """The Asset a release of ``model`` updates; consumers schedule on it."""
    return Asset(MODEL_ASSET_URI.format(model=model))


def embeddings_asset(model: str, corpus: str) -> Asset:
    """The Asset a release of ``model`` carrying ``corpus``'s embeddings updates."""
    return Asset(EMBEDDINGS_ASSET_URI.format(model=model, corpus=corpus))


def embedding_set_asset(model: str, version: str, corpus: str) -> Asset:
    """The Asset of one verified embedding set: ``corpus`` embedded with model ``version``,
    live or not."""
    return Asset(EMBEDDING_SET_ASSET_URI.format(model=model, version=version, corpus=corpus))


def corpus_asset(corpus: str) -> Asset:
    """The Asset of a corpus: its producer updates it when a change set lands (the REST
    API's ``POST /api/v2/assets/events``, or an SQS ``AssetWatcher``: docs/SEARCH.md), and
    ``corpus_sync`` runs on it."""
    return Asset(CORPUS_ASSET_URI.format(corpus=corpus))


def is_templated(*values: Any) -> bool:
    return any(isinstance(v, str) and ("{{" in v or "{%" in v) for v in values)
