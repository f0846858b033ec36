"""Release: ``python -m embedfresh.jobs.release --set run_id=R [--set corpora='["products"]']``.

Makes the run's release live: its model version together with, for every corpus, the
verified embedding set, the index table it was loaded into and the search check that
passed on it. In order:

1. the decision: this run's gate said PASS (otherwise exit 3, production untouched), or
   ``action=promote_anyway`` with a person's ``reason`` (the one exception);
2. per corpus: the embedding set's manifest, this run's index load of that very manifest
   and its search check's PASS on the same table; the table complete and indexed in the
   vector index (anything missing or stale: exit 2, naming it and what to run);
3. the release document ``models/{model}/releases/{run_id}.json``, written once
   (immutable: a re-run finds it and keeps it);
4. the registry's production pointer, moved to the release by compare-and-swap on the
   production the gate decided against and the release the search check compared with
   (another run that released first: exit 2, nothing written);
5. the live view of every corpus switched to its table, and those of ``drop_corpora``
   dropped (a re-run after a kill between 4 and 5 switches them: the release record is
   the truth, the views follow it).

Every corpus of the live release is released again or named in ``drop_corpora``
(otherwise exit 2 before anything is written): a corpus left out would keep serving
the previous model's vectors.

A failed or refused step leaves the live release as it was: a search service reading
:func:`embedfresh.core.releases.live_release` keeps getting the previous release, whole.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from embedfresh.core import layout, run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import ReleaseConfig
from embedfresh.core.embedding_sets import read_embedding_set
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.freshness import trained_through
from embedfresh.core.index import live_view_name, open_index
from embedfresh.core.registry import ANY, PROMOTE, Move, Registry
from embedfresh.core.releases import (
    CorpusRelease,
    Release,
    live_release,
    release_doc,
    write_release,
)
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger("embedfresh.jobs.release")

#: The search check's figures a release keeps (the whole report stays in the run).
CHECK_FIGURES = (
    "verdict", "reason", "queries", "queries_judged", "ann_recall", "ann_recall_by_ef_search",
    "min_ann_recall", "ndcg_at_10", "judged_at_10", "latency_ms", "dataset",
)  # fmt: skip


def release(cfg: ReleaseConfig) -> dict[str, Any]:
    """Make the run's release (model version + corpus embeddings + index tables) live."""
    store = ArtifactStore(cfg.artifact_root)
    version = cfg.target_version
    gate, expected_version = _decision(store, cfg, version)
    _names_every_live_corpus(store, cfg)
    corpora, expected_release = _checked_corpora(store, cfg, version)
    registry = Registry(store, cfg.model)
    # What the move would refuse, refused before the release document is written.
    registry.check_release(
        cfg.run_id,
        version,
        action=cfg.action,
        run_id=cfg.run_id,
        expected_version=expected_version,
        expected_release=expected_release,
    )
    doc = release_doc(
        model=cfg.model,
        release=cfg.run_id,
        version=version,
        version_url=store.url(layout.model_version(cfg.model, version)),
        run_id=cfg.run_id,
        action=cfg.action,
        corpora=corpora,
        gate=gate,
        who=cfg.who if cfg.action != PROMOTE else None,
        why=cfg.reason,
        trained_through=_iso(trained_through(store, cfg.model, version)),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    made, written = write_release(store, doc)
    log.info("release %s %s: %s", cfg.run_id, "written" if written else "already written", made.url)
    move = _move(registry, made, cfg, version, gate, expected_version, expected_release)
    switched = _switch_views(cfg, corpora)
    run_index.record(store, cfg.model, cfg.run_id)  # derived data: never fails the move
    return {
        **move.summary(registry.url),
        "release_url": made.url,
        "action": cfg.action,
        "corpora": {
            c: {"table": e.table, "rows": e.rows, "manifest": e.manifest}
            for c, e in corpora.items()
        },  # fmt: skip
        "live_views_switched": switched,
    }


def _checked_corpora(
    store: ArtifactStore, cfg: ReleaseConfig, version: str
) -> tuple[dict[str, CorpusRelease], Any]:
    """Each corpus's entry, and the live release every search check compared against
    (:data:`ANY` without corpora): checks against different ones are refused."""
    corpora: dict[str, CorpusRelease] = {}
    checked_against: set[Any] = set()
    for corpus in cfg.corpora:
        entry, live_at_check = _corpus(store, cfg, version, corpus)
        corpora[corpus] = entry
        checked_against.add(live_at_check)
    if len(checked_against) > 1:
        raise BadInputError(
            f"the search checks of {cfg.corpora} compared against different live releases "
            f"({sorted(map(str, checked_against))}): production moved between them; run them again"
        )
    if corpora:
        _tables_complete(cfg, corpora)
    else:
        log.warning(
            "release %s of %s carries no corpus embeddings: a search service reading it has "
            "no document vectors (corpora is empty)",
            cfg.run_id, cfg.model,
        )  # fmt: skip
    return corpora, checked_against.pop() if checked_against else ANY


def _move(
    registry: Registry,
    made: Release,
    cfg: ReleaseConfig,
    version: str,
    gate: dict[str, Any] | None,
    expected_version: Any,
    expected_release: Any,
) -> Move:
    """The registry's compare-and-swap to the release, with the decision that moved it."""
    details: dict[str, Any] = {"run_id": cfg.run_id}
    if gate is not None:
        details.update(
            verdict=gate["verdict"],
            mode=gate["mode"],
            reference=gate["reference"],
            gate_report=gate["report"],
            d=gate["d"],
        )
    if cfg.action != PROMOTE:
        details.update(who=cfg.who, why=cfg.reason)
    move = registry.release(
        made,
        action=cfg.action,
        details=details,
        expected_version=expected_version,
        expected_release=expected_release,
    )
    if move.already:
        log.info("release %s is live already (by this run): nothing to move", cfg.run_id)
    elif cfg.action == PROMOTE:
        log.info("live release of %s: %s -> %s (version %s)", cfg.model, move.doc["production"]
                 .get("previous_release") or move.previous, cfg.run_id, version)  # fmt: skip
    else:
        log.warning(
            "live release of %s moved to %s (version %s) WITHOUT a gate's PASS, by %s: %s",
            cfg.model, cfg.run_id, version, cfg.who, cfg.reason,
        )  # fmt: skip
    return move


def _iso(day: Any) -> str | None:
    return None if day is None else day.isoformat()


def _decision(
    store: ArtifactStore, cfg: ReleaseConfig, version: str
) -> tuple[dict[str, Any] | None, Any]:
    """The run's gate (its verdict, report, d) and the production version it decided
    against (what the compare-and-swap expects; :data:`ANY` for an override)."""
    rel = layout.report(cfg.model, cfg.run_id, cfg.gate_report)
    if not store.exists(rel):
        if cfg.action == PROMOTE:
            raise BadInputError(f"no gate report {store.url(rel)}: run the gate job first")
        return None, ANY
    decision = store.read_json(rel)
    try:
        verdict = decision["verdict"]
        candidate = decision["candidate"]["version"]
        gate = {
            "verdict": verdict,
            "mode": decision.get("mode"),
            "reference": decision["reference"]["version"],
            "report": store.url(rel),
            "d": {m["metric"]: m.get("d") for m in decision.get("metrics", [])},
        }
    except (KeyError, TypeError, AttributeError) as e:
        raise BadInputError(f"gate report {store.url(rel)} is malformed ({e!r})") from e
    if cfg.action != PROMOTE:
        return (gate if candidate == version else None), ANY
    if verdict != "PASS":
        raise GateRefusedError(
            f"gate verdict is {verdict} for run {cfg.run_id}: no release, the live release "
            "stays as it is"
        )
    if candidate != version:
        raise BadInputError(
            f"gate report {store.url(rel)} decided on version {candidate}, not {version}"
        )
    return gate, decision.get("production_at_decision")


def _corpus(
    store: ArtifactStore, cfg: ReleaseConfig, version: str, corpus: str
) -> tuple[CorpusRelease, str | None]:
    """One corpus's part of the release, and the live release its search check compared
    with (what the release expects still to be live)."""
    eset = read_embedding_set(store, cfg.model, version, corpus)
    load = _report(store, cfg, f"index-{corpus}", "index_load", corpus)
    check = _report(store, cfg, f"search-{corpus}", "search_check", corpus)
    for what, doc in (("index load", load), ("search check", check)):
        if doc.get("embeddings", {}).get("manifest_sha256") != eset.manifest_sha256:
            raise BadInputError(
                f"this run's {what} of {corpus!r} used other embeddings than "
                f"{eset.manifest_url} (they were embedded again since): run it again"
            )
    table = load["index"]["table"]
    # A person's move may release what the check could not decide, never what it refused.
    allowed = ("PASS",) if cfg.action == PROMOTE else ("PASS", "INCONCLUSIVE")
    if check.get("verdict") not in allowed or check.get("index", {}).get("table") != table:
        raise GateRefusedError(
            f"the search check of {corpus!r} for run {cfg.run_id} did not pass on table "
            f"{table} ({check.get('verdict')}: {check.get('reason')}): no release"
        )
    entry = CorpusRelease(
        corpus=corpus,
        manifest=eset.manifest_url,
        manifest_sha256=eset.manifest_sha256,
        rows=eset.rows,
        hidden=eset.hidden,
        settings=eset.settings,
        index={
            **load["index"],
            "ann": check["index"]["ann"],  # with the ef_search the check found faithful
            "live_view": live_view_name(cfg.model, corpus),
        },
        search_check={
            **{k: check.get(k) for k in CHECK_FIGURES},
            "compared_with": (check.get("regression") or {}).get("with"),
            "regression": {
                k: (check.get("regression") or {}).get(k) for k in ("verdict", "reason", "mode")
            },
            "report": store.url(layout.report(cfg.model, cfg.run_id, f"search-{corpus}")),
        },
    )
    return entry, check.get("live_release")


def _report(
    store: ArtifactStore, cfg: ReleaseConfig, kind: str, job: str, corpus: str
) -> dict[str, Any]:
    rel = layout.report(cfg.model, cfg.run_id, kind)
    if not store.exists(rel):
        raise BadInputError(
            f"no {job} report {store.url(rel)}: run python -m embedfresh.jobs.{job} "
            f"--set run_id={cfg.run_id} --set corpus={corpus} first"
        )
    return store.read_json(rel)


def _tables_complete(cfg: ReleaseConfig, corpora: dict[str, CorpusRelease]) -> None:
    """Every table is in the index, holds every row and is indexed: a release never names
    a table a search service would find half-loaded (or dropped since the check)."""
    with open_index(cfg.artifact_root) as index:
        tables = {t.name: t for t in index.tables(cfg.model)}
        for corpus, entry in corpora.items():
            if entry.index.get("location") != index.location:
                raise BadInputError(
                    f"corpus {corpus!r} was loaded into {entry.index.get('location')}, this "
                    f"job's index is {index.location}: release where it was loaded"
                )
            info = tables.get(entry.table)
            if info is None or info.rows_loaded != entry.rows or not info.indexed:
                raise BadInputError(
                    f"table {entry.table} of {index.location} is "
                    + ("missing" if info is None else f"{info.rows_loaded} of {entry.rows} rows, "
                       f"{'indexed' if info.indexed else 'not indexed'}")
                    + f": load it again (index_load --set run_id={cfg.run_id} --set corpus={corpus})"
                )  # fmt: skip


def _names_every_live_corpus(store: ArtifactStore, cfg: ReleaseConfig) -> None:
    """Every corpus of the live release is released again or dropped by name: a corpus
    left out would keep serving the previous model's vectors under the new model."""
    live = live_release(store, cfg.model)
    if live is None or live.release == cfg.run_id:
        return
    left = sorted(set(live.corpora) - set(cfg.corpora) - set(cfg.drop_corpora))
    if left:
        raise BadInputError(
            f"the live release {live.release} of {cfg.model} carries corpora {left} that "
            f"release {cfg.run_id} neither carries nor drops: release them too (corpora) "
            "or name them in drop_corpora (their live views are then dropped)"
        )


def _switch_views(cfg: ReleaseConfig, corpora: dict[str, CorpusRelease]) -> list[str]:
    """Each released corpus's live view onto its table; a dropped corpus's view gone."""
    if not corpora and not cfg.drop_corpora:
        return []
    switched = []
    with open_index(cfg.artifact_root) as index:
        for corpus, entry in corpora.items():
            if index.switch_live(cfg.model, corpus, entry.table):
                switched.append(corpus)
                log.info("live view %s now reads %s", entry.index["live_view"], entry.table)
        for corpus in cfg.drop_corpora:
            if index.drop_live(cfg.model, corpus):
                switched.append(corpus)
                log.warning("live view of %s %s dropped: release %s does not carry it",
                            cfg.model, corpus, cfg.run_id)  # fmt: skip
    return switched


if __name__ == "__main__":
    main_for("release", ReleaseConfig, release)
