"""Read what the jobs wrote, tolerantly, for the "Model quality" page.

Everything goes through :class:`embedfresh.core.storage.ArtifactStore` and :mod:`embedfresh.core.layout`, so
``file://`` and ``s3://`` roots behave the same. Reports come from jobs that evolve
independently of this page: a missing, unreadable or oddly shaped report becomes a
:class:`Section` with a message ("not available: ...") instead of an error, and one bad
report never hides the others.

Nothing here imports torch: the api-server must stay light (a test checks sys.modules).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from embedfresh.core import layout, markers, run_index
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.freshness import production_age, stale_after_days
from embedfresh.core.registry import PROMOTE, Registry
from embedfresh.core.releases import Release, kept_releases, production_release
from embedfresh.core.settings import DEFAULT_KEEP_RELEASES, keep_releases
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)

#: Reports read at once (threads); S3 latency, not CPU, bounds a page with many runs.
READERS = 16

GATE_REQUIRED = ("verdict",)
Found = tuple[list[tuple[str, dict]], list[str]]

#: The marker verify writes last under an embeddings folder (embedfresh.core.shards).
EMBEDDINGS_MANIFEST = "_MANIFEST.json"


@dataclass
class Section:
    """One part of the page: its data, or the reason it is not available."""

    data: Any = None
    message: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.data is not None

    def as_dict(self) -> dict[str, Any]:
        return {"available": self.available, **asdict(self)}


class ReportError(Exception):
    """A report that exists but cannot be used; the message names it and says why."""


def guarded(what: str, build: Callable[[], Section]) -> Section:
    """Run ``build``; any storage or format failure becomes a message on the section."""
    try:
        return build()
    except (ReportError, BadInputError) as e:
        return Section(message=f"{what} not available: {e}")
    except Exception as e:  # the page must render even when the store misbehaves
        log.warning("reading %s failed", what, exc_info=True)
        return Section(message=f"{what} not available: {type(e).__name__}: {e}")


def read_report(store: ArtifactStore, rel: str, *, required: Iterable[str] = ()) -> dict | None:
    """The JSON object at ``rel``; None when absent.

    :raises ReportError: it exists but is not a JSON object with the ``required`` keys.
    """
    try:  # one request, not exists() + read: on S3 each costs a round trip
        raw = store.read_bytes(rel)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportError(f"{store.url(rel)} is not valid JSON ({e})") from e
    if not isinstance(doc, dict):
        raise ReportError(f"{store.url(rel)} is not a JSON object")
    missing = [k for k in required if k not in doc]
    if missing:
        raise ReportError(f"{store.url(rel)} lacks {', '.join(missing)}")
    return doc


def _valid_ids(names: Iterable[str]) -> list[str]:
    """Folder names that are valid ids; anything else in the store is not ours to show."""
    out = []
    for name in names:
        try:
            out.append(layout.safe_id(name, "id"))
        except BadInputError:
            continue
    return out


def models(store: ArtifactStore) -> list[str]:
    """Every model with a registry, a version or a run in the store."""
    return sorted(set(_valid_ids(store.listdir("models"))) | set(_valid_ids(store.listdir("runs"))))


def _reports_of(
    store: ArtifactStore,
    model: str,
    kind: str,
    required: Iterable[str] = (),
    ids: list[str] | None = None,
) -> tuple[list[tuple[str, dict]], list[str]]:
    """(run id, report) for every run (or each of ``ids``) with a usable ``kind``
    report, plus the problems.

    Runs are read concurrently: on S3 every report is a round trip, and a model gathers
    one run a day.
    """

    def one(run_id: str) -> tuple[str, dict | None, str | None]:
        try:
            rel = layout.report(model, run_id, kind)
            return run_id, read_report(store, rel, required=required), None
        except ReportError as e:
            return run_id, None, str(e)

    ids = run_index.list_run_ids(store, model) if ids is None else ids
    if not ids:
        return [], []
    with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(ids)))) as pool:
        results = list(pool.map(one, ids))
    found = [(run_id, doc) for run_id, doc, _ in results if doc is not None]
    return found, [problem for _, _, problem in results if problem]


def _newest_first(rows: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Reports carry ``created_at`` (ISO UTC) when their job writes it; run ids break ties."""
    return sorted(rows, key=lambda r: (str(r[1].get("created_at") or ""), r[0]), reverse=True)


# -- registry and the live release ----------------------------------------------------

#: The registry as read once for a page: (document or None before the first release, URL).
RegistryRead = tuple[dict[str, Any] | None, str]


def read_registry(store: ArtifactStore, model: str) -> RegistryRead:
    """The registry as the jobs read it (:class:`embedfresh.core.registry.Registry`): one
    validation.

    :raises ReportError: it exists but is not a valid registry (its own message).
    """
    reg = Registry(store, model)
    try:
        doc, _ = reg.read()
    except BadInputError as e:
        raise ReportError(str(e)) from e
    return doc, reg.url


def _retention() -> tuple[int, list[str]]:
    """How many releases retention keeps (``$EMBEDFRESH_KEEP_RELEASES``), and the problem
    when the setting is not usable (the default applies then, as the page cannot refuse)."""
    try:
        return keep_releases(), []
    except ValueError as e:
        return DEFAULT_KEEP_RELEASES, [
            f"{e}: retention shown for the default, {DEFAULT_KEEP_RELEASES}"
        ]


def registry(store: ArtifactStore, model: str, read: RegistryRead | None = None) -> Section:
    """The registry's production entry and its history of moves, newest first, with the
    releases retention keeps (``kept``: the live one first; a rollback reaches the others).

    ``read``: the registry already read (:func:`read_registry`).
    """
    doc, url = read if read is not None else read_registry(store, model)
    if doc is None:
        return Section(message=f"no registry yet: {model} has never been released")
    keep, problems = _retention()
    return Section(
        data={
            "url": url,
            "production": doc.get("production"),
            "history": [h for h in reversed(doc["history"]) if isinstance(h, dict)],
            "keep": keep,
            "kept": kept_releases(doc, keep),
        },
        problems=problems,
    )


def release_data(release: Release, production: dict[str, Any], registry_url: str) -> dict[str, Any]:
    """What the page shows of the live release: the registry's production entry (how and
    when it went live) and the release document (its corpora, each with its embedding set,
    index table and search check figures)."""
    doc = release.doc
    return {
        "release": release.release,
        "version": release.version,
        "url": release.url,
        "registry": registry_url,
        "legacy": release.legacy,
        "bare": release.bare,
        "action": production.get("action", PROMOTE),
        "verdict": production.get("verdict"),
        "promoted_at": production.get("promoted_at"),
        "run_id": production.get("run_id"),
        "dag_id": production.get("dag_id"),
        "who": production.get("who"),
        "why": production.get("why"),
        "previous": production.get("previous"),
        "previous_release": production.get("previous_release"),
        "created_at": doc.get("created_at"),
        "gate": doc.get("gate"),
        "corpora": [
            {"corpus": name, **entry.to_dict()} for name, entry in sorted(release.corpora.items())
        ],
    }


def live_release(store: ArtifactStore, model: str, read: RegistryRead | None = None) -> Section:
    """The live release (:func:`embedfresh.core.releases.production_release`): the model
    version and, per corpus, its embedding set, index table and search check.

    A registry written before releases reads as a bare pointer (``legacy``), a release
    without corpora as ``bare``: production then has no verified embeddings.
    """
    doc, url = read if read is not None else read_registry(store, model)
    try:
        release = production_release(store, model, doc)
    except BadInputError as e:
        raise ReportError(str(e)) from e
    if release is None:
        return Section(message=f"no live release yet: {model} has never been released")
    return Section(data={**release_data(release, doc["production"], url),
                         "freshness": age_data(store, model, release.version)})  # fmt: skip


def age_data(store: ArtifactStore, model: str, version: str) -> dict[str, Any]:
    """Production's age in days of data (:mod:`embedfresh.core.freshness`)."""
    try:
        trained, newest, age = production_age(store, model, version)
        limit = stale_after_days()
    except (BadInputError, ValueError, OSError) as e:
        return {"problem": str(e)}
    return {
        "trained_through": trained.isoformat() if trained else None,
        "newest_data": newest.isoformat() if newest else None,
        "age_days": age,
        "stale_after_days": limit,
        "stale": age is not None and age >= limit,
    }


# -- gate decisions ------------------------------------------------------------------


# The rows live with the run index (:mod:`embedfresh.core.run_index`), which stores them.
_metric_rows = run_index.metric_rows
decision_row = run_index.decision_row


@dataclass
class Runs:
    """What the page knows of a model's runs, per report kind (``gate``, ``health``,
    ``compile``): (run id, row) pairs in the shapes of :mod:`embedfresh.core.run_index`.

    From the run index when the model has one (one read, whatever the number of runs),
    else from every run's reports (:func:`runs_of`).
    """

    rows: dict[str, list[tuple[str, dict]]]
    problems: dict[str, list[str]]
    source: str
    """``index`` or ``reports``."""
    gate_docs: dict[str, dict] = field(default_factory=dict)
    """Whole gate reports by run id, when they were read (no index)."""


def runs_of(store: ArtifactStore, model: str) -> Runs:
    """The model's runs from its index, or by reading every report when it has none.

    An index that cannot be used is named in the gate problems and the reports are read
    one by one instead; a run missing from the index (no job has updated it since the
    run wrote its reports) is read from its reports, so the page is never behind the
    store; the next index write (or ``python -m embedfresh.jobs.index_runs``) adds it.
    """
    kinds = tuple(run_index.KINDS)
    problems: dict[str, list[str]] = {k: [] for k in kinds}
    try:
        index = run_index.read(store, model)
    except run_index.RunIndexError as e:
        index = None
        problems["gate"].append(f"{e}; reading every run's reports instead")
    if index is not None:
        rows: dict[str, list[tuple[str, dict]]] = {k: [] for k in kinds}
        for run_id, entry in index["runs"].items():
            if not isinstance(entry, dict):
                continue
            for kind in kinds:
                if isinstance(entry.get(kind), dict):
                    rows[kind].append((run_id, entry[kind]))
            for problem in entry.get("problems") or []:
                kind = next((k for k in kinds if f"/reports/{k}.json" in str(problem)), "gate")
                problems[kind].append(str(problem))
        # Runs the index does not list yet (a fleet_health run, a job killed before its
        # index write) are read from their reports: one listing, then only those runs.
        missing = [r for r in run_index.list_run_ids(store, model) if r not in index["runs"]]
        for kind in kinds if missing else ():
            found, more = _reports_of(store, model, kind, run_index.KINDS[kind], missing)
            rows[kind] += [(r, run_index.ROWS[kind](r, doc)) for r, doc in found]
            problems[kind] += more
        return Runs(rows, problems, "index")
    found = {k: _reports_of(store, model, k, run_index.KINDS[k]) for k in kinds}
    return Runs(
        rows={k: [(r, run_index.ROWS[k](r, doc)) for r, doc in found[k][0]] for k in kinds},
        problems={k: problems[k] + found[k][1] for k in kinds},
        source="reports",
        gate_docs=dict(found["gate"][0]),
    )


def decisions(
    store: ArtifactStore, model: str, gates: Found | None = None, *, runs: Runs | None = None
) -> Section:
    """Every gate decision of ``model``, newest first (``gates``: reports already read)."""
    if gates is not None:
        found, problems = gates
        rows = [decision_row(run_id, doc) for run_id, doc in _newest_first(found)]
    else:
        runs = runs or runs_of(store, model)
        rows = [row for _, row in _newest_first(runs.rows["gate"])]
        problems = runs.problems["gate"]
    if not rows:
        return Section(message=f"no gate decision for {model} yet", problems=problems)
    return Section(data=rows, problems=problems)


def gate_report(store: ArtifactStore, model: str, run_id: str) -> dict[str, Any] | None:
    return read_report(store, layout.report(model, run_id, "gate"), required=GATE_REQUIRED)


def curve(gate: dict[str, Any]) -> list[dict[str, Any]]:
    """Evaluation points of a gate report: the parity job's ``points`` or the gate's
    ``curve`` (the first whose points carry their metrics), else its one final point.
    A parity report's ``curve`` is a summary per step (|d| only), not the points."""
    points = next(
        (
            gate[key]
            for key in ("points", "curve")
            if isinstance(gate.get(key), list)
            and any(isinstance(p, dict) and isinstance(p.get("metrics"), list) for p in gate[key])
        ),
        [{"step": "final", "metrics": gate.get("metrics")}],
    )
    return [
        {
            "step": p.get("step"),
            "verdict": p.get("verdict"),
            "metrics": _metric_rows(p.get("metrics")),
        }
        for p in points
        if isinstance(p, dict)
    ]


def latest_curve(
    store: ArtifactStore, model: str, gates: Found | None = None, *, runs: Runs | None = None
) -> Section:
    """The newest gate decision's curve: the latest candidate against its reference.

    With the run index, the newest decision comes from it and its gate.json (which holds
    the curve) is the one report read.
    """
    if gates is not None:
        found, problems = gates
        docs = dict(found)
        newest = [(r, decision_row(r, d)) for r, d in found]
    else:
        runs = runs or runs_of(store, model)
        docs, newest, problems = runs.gate_docs, runs.rows["gate"], list(runs.problems["gate"])
    if not newest:
        return Section(message=f"no gate report for {model} yet", problems=problems)
    run_id, row = _newest_first(newest)[0]
    gate = docs.get(run_id)
    if gate is None:
        try:
            gate = gate_report(store, model, run_id)
        except ReportError as e:
            problems.append(str(e))
    if gate is None:  # indexed, then removed or damaged: the index's row still shows
        gate = {"verdict": row.get("verdict"), "metrics": row.get("metrics")}
        problems.append(f"the gate report of run {run_id} is gone; its curve shows one point")
        data = {**row, "points": curve(gate)}
    else:
        data = {**decision_row(run_id, gate), "points": curve(gate)}
    data["tolerance"] = gate.get("tolerance") if "tolerance" in gate else row.get("tolerance")
    if data["tolerance"] is None:
        data["tolerance"] = 0.001
    return Section(data=data, problems=problems)


# -- health --------------------------------------------------------------------------


def health(store: ArtifactStore, model: str, *, runs: Runs | None = None) -> Section:
    """The newest health result per (host, rank), and the newest report's collectives."""
    runs = runs or runs_of(store, model)
    found, problems = runs.rows["health"], runs.problems["health"]
    if not found:
        return Section(message=f"no health report for {model} yet", problems=problems)
    ordered = _newest_first(found)
    per_rank: dict[tuple[str, str], dict[str, Any]] = {}
    for run_id, doc in ordered:  # newest first: keep the first seen per host/rank
        for rank in doc.get("ranks") or []:
            if not isinstance(rank, dict):
                continue
            key = (str(rank.get("host")), str(rank.get("rank")))
            checks = [c for c in rank.get("checks") or [] if isinstance(c, dict)]
            per_rank.setdefault(
                key,
                {
                    "host": rank.get("host"),
                    "rank": rank.get("rank"),
                    "device": rank.get("device"),
                    "run_id": run_id,
                    "created_at": doc.get("created_at"),
                    "passed": all(bool(c.get("passed")) for c in checks),
                    "checks": [{k: c.get(k) for k in ("name", "passed", "detail")} for c in checks],
                },
            )
    run_id, newest = ordered[0]
    collectives = [
        {k: c.get(k) for k in ("op", "size_bytes", "algbw_gbps", "busbw_gbps", "passed")}
        for c in newest.get("collectives") or []
        if isinstance(c, dict)
    ]
    return Section(
        data={
            "run_id": run_id,
            "verdict": newest.get("verdict"),
            "backend": newest.get("backend"),
            "world_size": newest.get("world_size"),
            "created_at": newest.get("created_at"),
            "failed": newest.get("failed") or [],
            "ranks": sorted(per_rank.values(), key=lambda r: (str(r["host"]), str(r["rank"]))),
            "collectives": collectives,
        },
        problems=problems,
    )


# -- compile cache -------------------------------------------------------------------


def compile_cache(store: ArtifactStore, model: str, *, runs: Runs | None = None) -> Section:
    """Committed cache entries with their size, and every compile report's hit or miss."""
    runs = runs or runs_of(store, model)
    found, problems = runs.rows["compile"], runs.problems["compile"]
    history: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run_id, doc in _newest_first(found):
        history.setdefault((str(doc.get("backend")), str(doc.get("key"))), []).append(
            {
                "run_id": run_id,
                "cache_hit": doc.get("cache_hit"),
                "mode": doc.get("mode"),
                "graphs": doc.get("graphs"),
                "cold_seconds_to_first_step": doc.get("cold_seconds_to_first_step"),
                "warm_seconds_to_first_step": doc.get("warm_seconds_to_first_step"),
                "created_at": doc.get("created_at"),
            }
        )
    entries = []
    for backend in _valid_ids(store.listdir("compile-cache")):
        for key in _valid_ids(store.listdir(f"compile-cache/{backend}")):
            directory = layout.compile_cache(backend, key)
            marker = markers.read_marker(store, directory)
            files = marker["files"] if marker else {}
            entries.append(
                {
                    "backend": backend,
                    "key": key,
                    "committed": marker is not None,
                    "files": len(files),
                    "size_bytes": sum(int(f.get("size") or 0) for f in files.values()),
                    "url": store.url(directory),
                    "history": history.pop((backend, key), []),
                }
            )
    for (backend, key), runs in history.items():  # reported, but no entry in the store
        entries.append(
            {
                "backend": backend,
                "key": key,
                "committed": False,
                "files": 0,
                "size_bytes": None,
                "url": None,
                "history": runs,
            }
        )
    if not entries:
        return Section(message="no compile cache entries yet", problems=problems)
    return Section(data=entries, problems=problems)


# -- embeddings ----------------------------------------------------------------------


def embeddings(store: ArtifactStore, model: str) -> Section:
    """Embedding runs of ``model``: one row per version and corpus, with manifest status."""
    runs, problems = [], []
    base = f"embeddings/{layout.safe_id(model, 'model')}"
    for version in _valid_ids(store.listdir(base)):
        for corpus in _valid_ids(store.listdir(f"{base}/{version}")):
            directory = layout.embeddings(model, version, corpus)
            names = store.listdir(directory)
            parts = [n for n in names if n.startswith("part-") and n.endswith(".parquet")]
            row = {
                "version": version,
                "corpus": corpus,
                "parts": len(parts),
                "rows": None,
                "sentences_per_s": None,
                "created_at": None,
                "url": store.url(directory),
            }
            manifest = markers.read_marker(store, directory, name=EMBEDDINGS_MANIFEST)
            if manifest is None:
                row["status"] = (
                    "manifest unreadable"
                    if EMBEDDINGS_MANIFEST in names
                    else "incomplete: no manifest yet"
                )
                if EMBEDDINGS_MANIFEST in names:
                    problems.append(f"{store.url(directory)}/{EMBEDDINGS_MANIFEST} is not valid")
            else:
                throughput = manifest.get("throughput") or {}
                row.update(
                    status="verified",
                    rows=manifest.get("rows"),
                    sentences_per_s=throughput.get("sentences_per_s")
                    if isinstance(throughput, dict)
                    else None,
                    created_at=manifest.get("created_at"),
                )
            runs.append(row)
    if not runs:
        return Section(message=f"no embedding runs for {model} yet", problems=problems)
    return Section(data=runs, problems=problems)


# -- cost ---------------------------------------------------------------------------------

#: Runs whose cost records the page reads (each costs two listings and a read per record).
COST_RUNS = 10


def newest_runs(runs: Runs, count: int) -> list[str]:
    """The ids of the ``count`` newest runs that reported anything the page reads."""
    every = [pair for kind in runs.rows.values() for pair in kind]
    newest: list[str] = []
    for run_id, _ in _newest_first(every):
        if run_id not in newest:
            newest.append(run_id)
    return newest[:count]


def costs(store: ArtifactStore, model: str, *, runs: Runs | None = None) -> Section:
    """What the newest runs cost: their executions' cost records (every attempt, on the
    runner's own clock: the local process's, or AWS Batch's) added up per run."""
    from embedfresh.core.cost import read_run_costs, run_cost_total

    newest = newest_runs(runs or runs_of(store, model), COST_RUNS)
    if not newest:
        return Section(message=f"no runs of {model} yet")
    with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(newest)))) as pool:
        records = list(pool.map(lambda r: read_run_costs(store, model, r), newest))
    rows = []
    for run_id, recs in zip(newest, records, strict=True):
        if not recs:
            continue
        costliest = max(recs, key=lambda r: float(r.get("estimated_cost_usd") or 0))
        rows.append(
            {
                "run_id": run_id,
                **run_cost_total(recs),
                "instance_types": sorted({str(r.get("instance_type")) for r in recs}),
                "runners": sorted({str(r.get("runner")) for r in recs}),
                "costliest": costliest.get("task"),
            }
        )
    if not rows:
        return Section(message=f"no cost records in the newest {len(newest)} runs of {model}")
    return Section(data=rows)


# -- search checks -----------------------------------------------------------------------

#: Runs whose search checks the page reads (each costs a listing and a read per corpus).
SEARCH_RUNS = 10
SEARCH_PREFIX = "search-"
SEARCH_REQUIRED = ("verdict", "corpus")


def search_check_row(run_id: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The figures of one search check report (``reports/search-{corpus}.json``)."""
    regression = doc.get("regression") if isinstance(doc.get("regression"), dict) else {}
    index = doc.get("index") if isinstance(doc.get("index"), dict) else {}
    return {
        "run_id": run_id,
        "corpus": doc.get("corpus"),
        "verdict": doc.get("verdict"),
        "reason": doc.get("reason"),
        "release": doc.get("release"),
        "version": doc.get("version"),
        "table": index.get("table"),
        "queries": doc.get("queries"),
        "queries_judged": doc.get("queries_judged"),
        "ann_recall": doc.get("ann_recall"),
        "min_ann_recall": doc.get("min_ann_recall"),
        "ndcg_at_10": doc.get("ndcg_at_10"),
        "judged_at_10": doc.get("judged_at_10"),
        "latency_ms": doc.get("latency_ms"),
        "compared_with": regression.get("with"),
        "regression": {k: regression.get(k) for k in ("verdict", "reason", "mode")},
        "live_release": doc.get("live_release"),
    }


def search_checks(store: ArtifactStore, model: str, *, runs: Runs | None = None) -> Section:
    """The search checks of the newest runs (each corpus's ``search-{corpus}.json``), newest
    run first: a refresh whose check failed made no release, and says why here."""
    newest = newest_runs(runs or runs_of(store, model), SEARCH_RUNS)

    def one(run_id: str) -> tuple[list[tuple[str, dict]], list[str]]:
        reports_dir = layout.reports(model, run_id)
        found, problems = [], []
        for name in store.listdir(reports_dir):
            if not (name.startswith(SEARCH_PREFIX) and name.endswith(".json")):
                continue
            try:
                doc = read_report(store, f"{reports_dir}/{name}", required=SEARCH_REQUIRED)
            except ReportError as e:
                problems.append(str(e))
                continue
            if doc is not None:
                found.append((run_id, doc))
        return found, problems

    if not newest:
        return Section(message=f"no runs of {model} yet")
    with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(newest)))) as pool:
        results = list(pool.map(one, newest))
    rows = [
        search_check_row(run_id, doc)
        for found, _ in results
        for run_id, doc in sorted(found, key=lambda f: str(f[1].get("corpus")))
    ]
    problems = [p for _, more in results for p in more]
    if not rows:
        return Section(
            message=f"no search check in the newest {len(newest)} runs of {model}",
            problems=problems,
        )
    return Section(data=rows, problems=problems)


def overview(store: ArtifactStore, model: str) -> dict[str, Section]:
    """Every section of the page for one model, each read on its own.

    The runs (the run index, or every run's reports when there is none) feed six
    sections and the registry two; each is read once, and if that read fails, each
    section tries again and reports the failure itself.
    """
    try:
        runs: Runs | None = runs_of(store, model)
    except Exception:
        runs = None
    try:
        read: RegistryRead | None = read_registry(store, model)
    except Exception:
        read = None
    return {
        "registry": guarded("registry", lambda: registry(store, model, read)),
        "release": guarded("live release", lambda: live_release(store, model, read)),
        "decisions": guarded("gate decisions", lambda: decisions(store, model, runs=runs)),
        "curve": guarded("evaluation curve", lambda: latest_curve(store, model, runs=runs)),
        "health": guarded("health report", lambda: health(store, model, runs=runs)),
        "compile_cache": guarded("compile cache", lambda: compile_cache(store, model, runs=runs)),
        "embeddings": guarded("embedding runs", lambda: embeddings(store, model)),
        "costs": guarded("cost records", lambda: costs(store, model, runs=runs)),
        "search_checks": guarded("search checks", lambda: search_checks(store, model, runs=runs)),
    }
