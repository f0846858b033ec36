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

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.registry import Registry
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


def run_ids(store: ArtifactStore, model: str) -> list[str]:
    return _valid_ids(store.listdir(f"runs/{layout.safe_id(model, 'model')}"))


def _reports_of(
    store: ArtifactStore, model: str, kind: str, required: Iterable[str] = ()
) -> tuple[list[tuple[str, dict]], list[str]]:
    """(run id, report) for every run with a usable ``kind`` report, plus the problems.

    Runs are read concurrently: on S3 every report is a round trip, and a model gathers
    one run a day.
    """

    def one(run_id: str) -> tuple[str, dict | None, str | None]:
        try:
            rel = layout.report(model, run_id, kind)
            return run_id, read_report(store, rel, required=required), None
        except ReportError as e:
            return run_id, None, str(e)

    ids = run_ids(store, model)
    with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(ids)))) as pool:
        results = list(pool.map(one, ids))
    found = [(run_id, doc) for run_id, doc, _ in results if doc is not None]
    return found, [problem for _, _, problem in results if problem]


def _newest_first(rows: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Reports carry ``created_at`` (ISO UTC) when their job writes it; run ids break ties."""
    return sorted(rows, key=lambda r: (str(r[1].get("created_at") or ""), r[0]), reverse=True)


# -- registry ------------------------------------------------------------------------


def registry(store: ArtifactStore, model: str) -> Section:
    """The registry as the jobs read it (:class:`embedfresh.core.registry.Registry`): one validation."""
    reg = Registry(store, model)
    try:
        doc, _ = reg.read()
    except BadInputError as e:
        raise ReportError(str(e)) from e
    if doc is None:
        return Section(message=f"no registry yet: {model} has never been promoted")
    return Section(
        data={
            "url": reg.url,
            "production": doc.get("production"),
            "history": [h for h in reversed(doc["history"]) if isinstance(h, dict)],
        }
    )


# -- gate decisions ------------------------------------------------------------------


def _metric_rows(metrics: Any) -> list[dict[str, Any]]:
    keys = ("metric", "d", "ci_low", "ci_high", "n", "m_cand", "m_ref", "verdict", "reason")
    if not isinstance(metrics, list):
        return []
    return [{k: m.get(k) for k in keys} for m in metrics if isinstance(m, dict)]


def _reference_version(reference: Any) -> str | None:
    if isinstance(reference, dict):
        return reference.get("version")
    return reference if isinstance(reference, str) else None


def decision_row(run_id: str, gate: dict[str, Any]) -> dict[str, Any]:
    """The fields the page and the API show for one gate.json."""
    candidate = gate.get("candidate") if isinstance(gate.get("candidate"), dict) else {}
    return {
        "run_id": gate.get("run_id") or run_id,
        "dag_id": gate.get("dag_id"),
        "verdict": gate.get("verdict"),
        "mode": gate.get("mode"),
        "tolerance": gate.get("tolerance"),
        "confidence": gate.get("confidence"),
        "n": gate.get("n_examples"),
        "n_queries": gate.get("n_queries"),
        "n_needed": gate.get("n_needed"),
        "candidate": candidate.get("version"),
        "reference": _reference_version(gate.get("reference")),
        "reason": gate.get("reason"),
        "created_at": gate.get("created_at"),
        "metrics": _metric_rows(gate.get("metrics")),
    }


def decisions(store: ArtifactStore, model: str, gates: Found | None = None) -> Section:
    found, problems = gates or _reports_of(store, model, "gate", required=GATE_REQUIRED)
    rows = [decision_row(run_id, doc) for run_id, doc in _newest_first(found)]
    if not rows:
        return Section(message=f"no gate decision for {model} yet", problems=problems)
    return Section(data=rows, problems=problems)


def gate_report(store: ArtifactStore, model: str, run_id: str) -> dict[str, Any] | None:
    return read_report(store, layout.report(model, run_id, "gate"), required=GATE_REQUIRED)


def curve(gate: dict[str, Any]) -> list[dict[str, Any]]:
    """Evaluation points of a gate report: ``curve`` when present, else its one final point."""
    points = gate.get("curve")
    if not isinstance(points, list) or not points:
        points = [{"step": "final", "metrics": gate.get("metrics")}]
    return [
        {
            "step": p.get("step"),
            "verdict": p.get("verdict"),
            "metrics": _metric_rows(p.get("metrics")),
        }
        for p in points
        if isinstance(p, dict)
    ]


def latest_curve(store: ArtifactStore, model: str, gates: Found | None = None) -> Section:
    """The newest gate decision's curve: the latest candidate against its reference."""
    found, problems = gates or _reports_of(store, model, "gate", required=GATE_REQUIRED)
    if not found:
        return Section(message=f"no gate report for {model} yet", problems=problems)
    run_id, gate = _newest_first(found)[0]
    return Section(
        data={
            **decision_row(run_id, gate),
            "tolerance": gate.get("tolerance", 0.001),
            "points": curve(gate),
        },
        problems=problems,
    )


# -- health --------------------------------------------------------------------------


def health(store: ArtifactStore, model: str) -> Section:
    """The newest health result per (host, rank), and the newest report's collectives."""
    found, problems = _reports_of(store, model, "health", required=("verdict",))
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


def compile_cache(store: ArtifactStore, model: str) -> Section:
    """Committed cache entries with their size, and every compile report's hit or miss."""
    found, problems = _reports_of(store, model, "compile", required=("key",))
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


def overview(store: ArtifactStore, model: str) -> dict[str, Section]:
    """Every section of the page for one model, each read on its own.

    The gate reports feed two sections and are read once; if that read fails, each
    section tries again and reports the failure itself.
    """
    try:
        gates: Found | None = _reports_of(store, model, "gate", required=GATE_REQUIRED)
    except Exception:
        gates = None
    return {
        "registry": guarded("registry", lambda: registry(store, model)),
        "decisions": guarded("gate decisions", lambda: decisions(store, model, gates)),
        "curve": guarded("evaluation curve", lambda: latest_curve(store, model, gates)),
        "health": guarded("health report", lambda: health(store, model)),
        "compile_cache": guarded("compile cache", lambda: compile_cache(store, model)),
        "embeddings": guarded("embedding runs", lambda: embeddings(store, model)),
    }
