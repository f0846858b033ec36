"""Releases: what goes live, as one unit (DESIGN "Releases: what goes live").

A search service needs two things from one model: the query encoder and the document
vectors. A release names both and never one without the other: the model version, and
per corpus its verified embedding set (manifest URL, the manifest's sha256, rows, how it
was embedded), the index table it was loaded into and the search check's figures. It is
one immutable JSON document, ``models/{model}/releases/{release}.json``, written once by
the release job; the registry's production pointer (:mod:`embedfresh.core.registry`)
then moves from release to release by compare-and-swap, so a reader of the live release
always gets a complete one.

:func:`live_release` is the one call a search service makes::

    from embedfresh.core.releases import live_release

    release = live_release("s3://bucket/prefix", "search")
    table = release.corpus("products").table       # search this table ...
    version = release.version                      # ... with this model's query encoder

A registry written before releases existed points at a bare version: it reads as a
release without corpora (:attr:`Release.legacy`), and the next refresh makes the first
full release. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.registry import Registry, kept_releases, release_history
from embedfresh.core.storage import ArtifactStore, json_bytes

__all__ = [
    "CorpusRelease",
    "Release",
    "kept_releases",
    "live_release",
    "production_release",
    "read_release",
    "release_doc",
    "release_history",
    "releases_carrying",
    "write_release",
]

FORMAT = 1
"""Version of the release document's layout."""

#: Fields a re-run may write differently without changing what the release is.
_VOLATILE = ("created_at",)


@dataclass(frozen=True)
class CorpusRelease:
    """One corpus of a release: its embedding set, its index table, its search check."""

    corpus: str
    manifest: str
    """URL of the embedding set's ``_MANIFEST.json``."""
    manifest_sha256: str
    rows: int
    hidden: int
    settings: dict[str, Any]
    """How every vector was embedded (truncation length, pooling, prompt, quantisation,
    backend): what the release's query encoder repeats."""
    index: dict[str, Any]
    """``kind``, ``location`` (no credentials), ``table``, ``live_view``, ``ann``."""
    search_check: dict[str, Any]

    @property
    def table(self) -> str:
        return self.index["table"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "embeddings": {
                "manifest": self.manifest,
                "manifest_sha256": self.manifest_sha256,
                "rows": self.rows,
                "hidden": self.hidden,
                "settings": self.settings,
            },
            "index": self.index,
            "search_check": self.search_check,
        }

    @classmethod
    def from_dict(cls, corpus: str, doc: Any, where: str) -> CorpusRelease:
        try:
            emb = doc["embeddings"]
            return cls(
                corpus=corpus,
                manifest=str(emb["manifest"]),
                manifest_sha256=str(emb["manifest_sha256"]),
                rows=int(emb["rows"]),
                hidden=int(emb["hidden"]),
                settings=dict(emb["settings"]),
                index=dict(doc["index"]),
                search_check=dict(doc.get("search_check") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise BadInputError(f"release {where}: corpus {corpus!r} is malformed ({e!r})") from e


@dataclass(frozen=True)
class Release:
    """A release as read from the store (or a bare pointer of an older registry)."""

    model: str
    release: str | None
    """The release's id (the run that made it); None for a bare pointer."""
    version: str
    corpora: dict[str, CorpusRelease] = field(default_factory=dict)
    doc: dict[str, Any] = field(default_factory=dict)
    """The whole document as stored."""
    url: str | None = None
    legacy: bool = False
    """A registry entry from before releases: a model version without corpus embeddings."""

    @property
    def bare(self) -> bool:
        """No corpus embeddings: a search service has no document vectors from it."""
        return not self.corpora

    def corpus(self, name: str) -> CorpusRelease:
        """The release's ``name`` corpus.

        :raises BadInputError: the release has no such corpus (the message lists its own).
        """
        try:
            return self.corpora[name]
        except KeyError:
            what = f"release {self.release}" if self.release else f"production {self.version}"
            raise BadInputError(
                f"{what} of {self.model} has no corpus {name!r} (it has: "
                f"{', '.join(self.corpora) or 'none: a model without document vectors'})"
            ) from None

    @classmethod
    def from_doc(cls, doc: Any, url: str) -> Release:
        if not isinstance(doc, dict) or doc.get("kind") != "release":
            raise BadInputError(f"{url} is not a release document")
        if doc.get("format") != FORMAT:
            raise BadInputError(
                f"release {url} has format {doc.get('format')!r}; this embedfresh reads "
                f"format {FORMAT}: upgrade embedfresh"
            )
        corpora = doc.get("corpora")
        if not isinstance(corpora, dict):
            raise BadInputError(f"release {url} has no corpora mapping")
        try:
            return cls(
                model=str(doc["model"]),
                release=str(doc["release"]),
                version=str(doc["version"]),
                corpora={c: CorpusRelease.from_dict(c, d, url) for c, d in corpora.items()},
                doc=doc,
                url=url,
            )
        except KeyError as e:
            raise BadInputError(f"release {url} lacks {e}") from e


def release_doc(
    *,
    model: str,
    release: str,
    version: str,
    version_url: str,
    run_id: str,
    action: str,
    corpora: dict[str, CorpusRelease],
    gate: dict[str, Any] | None = None,
    who: str | None = None,
    why: str | None = None,
    trained_through: str | None = None,
    created_at: str,
) -> dict[str, Any]:
    """The document :func:`write_release` stores (format :data:`FORMAT`);
    ``trained_through``: the end (exclusive) of the newest data its model trained on,
    from which production's age is measured (:mod:`embedfresh.core.freshness`)."""
    doc: dict[str, Any] = {
        "kind": "release",
        "format": FORMAT,
        "model": model,
        "release": release,
        "version": version,
        "version_url": version_url,
        "run_id": run_id,
        "action": action,
        "gate": gate,
        "corpora": {name: c.to_dict() for name, c in sorted(corpora.items())},
        "created_at": created_at,
    }
    if who is not None:
        doc["who"] = who
    if why is not None:
        doc["why"] = why
    if trained_through is not None:
        doc["trained_through"] = trained_through
    return doc


def read_release(store: ArtifactStore, model: str, release_id: str) -> Release:
    """The release ``release_id`` of ``model``.

    :raises BadInputError: there is none, or it is not a valid release document.
    """
    rel = layout.release(model, release_id)
    if not store.exists(rel):
        raise BadInputError(f"model {model} has no release {release_id} ({store.url(rel)})")
    return Release.from_doc(store.read_json(rel), store.url(rel))


def write_release(store: ArtifactStore, doc: dict[str, Any]) -> tuple[Release, bool]:
    """Write a release document once; a release is immutable.

    Written with a create-only compare-and-swap. When it already exists with the same
    contents (a re-run after a kill right after this write), the stored one is kept,
    byte for byte, and returned with ``False``.

    :raises ConflictError: a release of that id exists with other contents.
    """
    rel = layout.release(doc["model"], doc["release"])
    try:
        store.write_if_match(rel, json_bytes(doc), None)
        return Release.from_doc(doc, store.url(rel)), True
    except ConflictError:
        stored = store.read_json(rel)
        if _comparable(stored) != _comparable(doc):
            raise ConflictError(
                f"release {store.url(rel)} exists with other contents: a release is "
                "immutable; release under another run id"
            ) from None
        return Release.from_doc(stored, store.url(rel)), False


def _comparable(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return doc
    return json.loads(json.dumps({k: v for k, v in doc.items() if k not in _VOLATILE}))


def production_release(
    store: ArtifactStore, model: str, registry_doc: dict[str, Any] | None
) -> Release | None:
    """The release the registry document ``registry_doc`` points at; None before any."""
    production = (registry_doc or {}).get("production")
    if not production:
        return None
    release_id = production.get("release")
    if release_id is None:  # a registry from before releases: a bare model pointer
        return Release(model=model, release=None, version=production["version"], legacy=True)
    return read_release(store, model, release_id)


def live_release(artifact_root: str | ArtifactStore, model: str) -> Release | None:
    """The live release of ``model``: the one call a search service makes.

    Reads the registry, then the release it points at; the document is immutable, so
    the query encoder's version and every corpus's table come from one release. None
    before the first release.

    :raises BadInputError: the registry or the release document is not valid.
    """
    store = (
        artifact_root if isinstance(artifact_root, ArtifactStore) else ArtifactStore(artifact_root)
    )
    doc, _ = Registry(store, model).read()
    return production_release(store, model, doc)


def table_location(store: ArtifactStore, release: Release, corpus: str) -> str | None:
    """Where ``release``'s table of ``corpus`` lives: where ``index_attach`` last put it,
    else where it was loaded (the release document's)."""
    if release.release is not None:
        rel = layout.index_location(release.model, release.release)
        if store.exists(rel):
            return store.read_json(rel).get("location")
    return release.corpus(corpus).index.get("location")


def releases_carrying(store: ArtifactStore, model: str, version: str, corpus: str) -> list[str]:
    """The kept releases (:func:`kept_releases`, ``$EMBEDFRESH_KEEP_RELEASES``) whose
    ``corpus`` embeddings are those of ``version``: a set that must not change."""
    from embedfresh.core.settings import keep_releases

    doc, _ = Registry(store, model).read()
    found = []
    for release_id in kept_releases(doc, keep_releases()):
        release = read_release(store, model, release_id)
        if release.version == version and corpus in release.corpora:
            found.append(release_id)
    return found
