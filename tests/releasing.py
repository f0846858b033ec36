"""Making a version live in a test, the two ways the product does it.

- :func:`bare_release`: a release without corpora (what ``publish_model`` makes of a base
  version), written straight through :mod:`embedfresh.core.releases` and the registry's
  compare-and-swap: for tests of training, gating and the registry that need "a
  production version" and no vector index.
- :func:`release_run`: the refresh's tail for one run, every job in this process:
  embed, verify, load the index, search check, release. Needs an index
  (``EMBEDFRESH_INDEX_DSN``: the ``index_dsn`` fixture).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from embedfresh.core import layout
from embedfresh.core.registry import ANY, PROMOTE, Move, Registry
from embedfresh.core.releases import release_doc, write_release
from embedfresh.core.storage import ArtifactStore


def bare_release(
    store: ArtifactStore,
    model: str,
    version: str,
    release: str | None = None,
    *,
    run_id: str | None = None,
    expected_version: Any = ANY,
) -> Move:
    """Make ``version`` live as release ``release`` (default: the version's name), with
    no corpus embeddings."""
    release = release or version
    made, _ = write_release(
        store,
        release_doc(
            model=model,
            release=release,
            version=version,
            version_url=store.url(layout.model_version(model, version)),
            run_id=run_id or release,
            action=PROMOTE,
            corpora={},
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        ),
    )
    return Registry(store, model).release(
        made,
        details={"run_id": run_id or release, "verdict": "PASS"},
        expected_version=expected_version,
    )


def release_run(
    root: str,
    run_id: str,
    *,
    model: str = "tiny",
    version: str | None = None,
    corpus: str = "products",
    gate: bool = True,
    **check: Any,
) -> dict[str, Any]:
    """Embed, verify, load, check and release ``run_id``'s candidate (``version``, default
    the run id) with ``corpus``; returns each job's summary by name. With ``gate``, a PASS
    gate report is written first when the run has none (the release needs one)."""
    from embedfresh.core.config import (
        EmbedConfig,
        IndexLoadConfig,
        ReleaseConfig,
        SearchCheckConfig,
    )
    from embedfresh.jobs.embed import embed
    from embedfresh.jobs.embed_verify import verify
    from embedfresh.jobs.index_load import index_load
    from embedfresh.jobs.release import release
    from embedfresh.jobs.search_check import search_check

    version = version or run_id
    store = ArtifactStore(root)
    common = {"artifact_root": root, "model": model, "run_id": run_id}
    if gate and not store.exists(layout.report(model, run_id, "gate")):
        write_pass_gate(store, model, run_id, version)
    out = {
        "embed": embed(EmbedConfig(**common, version=version, corpus=corpus)),
        "embed_verify": verify(EmbedConfig(**common, version=version, corpus=corpus)),
        "index_load": index_load(IndexLoadConfig(**common, version=version, corpus=corpus)),
        "search_check": search_check(
            SearchCheckConfig(**common, version=version, corpus=corpus, **check)
        ),
    }
    out["release"] = release(ReleaseConfig(**common, version=version, corpora=[corpus]))
    return out


def write_pass_gate(store: ArtifactStore, model: str, run_id: str, candidate: str) -> None:
    """A gate report that says PASS against the current production, as the gate writes it."""
    production = Registry(store, model).production_version()
    store.write_json(
        layout.report(model, run_id, "gate"),
        {
            "verdict": "PASS",
            "mode": "no_regression",
            "candidate": {"version": candidate},
            "reference": {"version": production or "baseline"},
            "production_at_decision": production,
            "metrics": [{"metric": "accuracy", "d": 0.0, "verdict": "PASS"}],
        },
    )
