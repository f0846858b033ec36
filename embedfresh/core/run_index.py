"""The run index: ``runs/{model}/_index.json``, what the web UI needs of every run in one object.

A page that read one ``gate.json`` (and one health and compile report) per run took 8 s
with 100 runs on S3; a year of daily runs would not load. The index holds, per run, the
rows the page shows: the gate's decision row (verdict, metrics with their intervals,
reference, times), the health and compile summaries, and the run's moves of the
live release (releases, promote-anyway overrides, rollbacks) from the registry's history.

It is **derived data**, never a source of truth: every entry is rebuilt from the run's
reports and the registry. The gate, health, release and rollback jobs
update it after their own writes (:func:`record`), by compare-and-swap on its version
tag, so concurrent runs each add their entry. Each update also repairs what it finds
missing or lagging: runs with no entry (a job killed between its report and the index,
a job that does not write the index, such as the compile job) and runs whose entry was
taken before their gate reported. An update that fails is logged and does not fail its job: the next
update, or ``python -m embedfresh.jobs.index_runs --root ROOT --model MODEL`` (a rebuild
from every report), puts it right, and the gate is never retried for it.

Nothing here imports torch or Airflow: the web UI reads it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore, json_bytes

log = logging.getLogger(__name__)

FORMAT = 1
#: Compare-and-swap attempts before an update gives up (another writer won each time).
ATTEMPTS = 5
#: Reports read at once while (re)building entries: S3 latency bounds a rebuild.
READERS = 16
#: The reports an entry summarises, with the keys each must have to be used.
KINDS = {"gate": ("verdict",), "health": ("verdict",), "compile": ("key",)}
REBUILD_COMMAND = "python -m embedfresh.jobs.index_runs --root {root} --model {model}"


class RunIndexError(Exception):
    """An index that exists but cannot be used (not JSON, another format)."""


# -- rows: one report's fields as the page shows them ------------------------------


def metric_rows(metrics: Any) -> list[dict[str, Any]]:
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
        "metrics": metric_rows(gate.get("metrics")),
        # Metrics of the gate's config it did not compare, and why (an untrained head).
        "metrics_not_compared": gate.get("metrics_not_compared") or {},
    }


def health_row(doc: dict[str, Any]) -> dict[str, Any]:
    """A health report reduced to what the page shows: verdict, ranks with their checks,
    collectives."""
    ranks = []
    for rank in doc.get("ranks") or []:
        if not isinstance(rank, dict):
            continue
        checks = [c for c in rank.get("checks") or [] if isinstance(c, dict)]
        ranks.append(
            {
                "host": rank.get("host"),
                "rank": rank.get("rank"),
                "device": rank.get("device"),
                "checks": [{k: c.get(k) for k in ("name", "passed", "detail")} for c in checks],
            }
        )
    return {
        "verdict": doc.get("verdict"),
        "backend": doc.get("backend"),
        "world_size": doc.get("world_size"),
        "created_at": doc.get("created_at"),
        "failed": doc.get("failed") or [],
        "ranks": ranks,
        "collectives": [
            {k: c.get(k) for k in ("op", "size_bytes", "algbw_gbps", "busbw_gbps", "passed")}
            for c in doc.get("collectives") or []
            if isinstance(c, dict)
        ],
    }


def compile_row(doc: dict[str, Any]) -> dict[str, Any]:
    """A compile report reduced to its cache key, hit or miss and timings."""
    keys = (
        "backend",
        "key",
        "cache_hit",
        "mode",
        "graphs",
        "cold_seconds_to_first_step",
        "warm_seconds_to_first_step",
        "created_at",
    )
    return {k: doc.get(k) for k in keys}


ROWS = {
    "gate": lambda run_id, doc: decision_row(run_id, doc),
    "health": lambda run_id, doc: health_row(doc),
    "compile": lambda run_id, doc: compile_row(doc),
}


# -- reading -------------------------------------------------------------------------


def read(store: ArtifactStore, model: str) -> dict[str, Any] | None:
    """The model's index, one request; None when there is none.

    :raises RunIndexError: it exists but is not a usable index (rebuild it).
    """
    rel = layout.run_index(model)
    try:
        raw = store.read_bytes(rel)
    except FileNotFoundError:
        return None
    return _parse(store, rel, raw)


def _parse(store: ArtifactStore, rel: str, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunIndexError(f"run index {store.url(rel)} is not valid JSON ({e})") from e
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not isinstance(doc.get("runs"), dict)
    ):
        raise RunIndexError(
            f"run index {store.url(rel)} is not a format-{FORMAT} index (format, runs)"
        )
    return doc


# -- building entries ----------------------------------------------------------------


def _report(store: ArtifactStore, model: str, run_id: str, kind: str) -> dict | str:
    """The report as a dict, or why it cannot be used (a message)."""
    rel = layout.report(model, run_id, kind)
    try:
        doc = json.loads(store.read_bytes(rel))
    except FileNotFoundError:
        return f"{store.url(rel)} vanished while indexing"
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"{store.url(rel)} is not valid JSON ({e})"
    if not isinstance(doc, dict):
        return f"{store.url(rel)} is not a JSON object"
    missing = [k for k in KINDS[kind] if k not in doc]
    if missing:
        return f"{store.url(rel)} lacks {', '.join(missing)}"
    return doc


def run_entry(store: ArtifactStore, model: str, run_id: str) -> dict[str, Any]:
    """A run's entry from its reports (one listing, then the reports it has): each of
    ``gate``, ``health``, ``compile`` is its row or None; ``problems`` names reports
    that exist but cannot be used. ``promotions`` is filled by the update."""
    names = store.listdir(layout.reports(model, run_id))
    kinds = sorted(n[: -len(".json")] for n in names if n.endswith(".json"))
    entry: dict[str, Any] = {"reports": kinds, "problems": []}
    for kind, row in ROWS.items():
        entry[kind] = None
        if kind in kinds:
            doc = _report(store, model, run_id, kind)
            if isinstance(doc, dict):
                entry[kind] = row(run_id, doc)
            else:
                entry["problems"].append(doc)
    return entry


def _awaiting(entry: Any) -> bool:
    """An entry taken before the run's gate reported (evaluated, or nothing yet): the
    next update looks at the run again. A health-only run (fleet_health) is complete."""
    if not isinstance(entry, dict) or not isinstance(entry.get("reports"), list):
        return True
    kinds = entry["reports"]
    if "gate" in kinds:
        return False
    return not kinds or any(str(k).startswith("eval") for k in kinds)


def _promotions(history: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """The registry's moves by the run that made them, oldest first."""
    keys = (
        "action", "version", "release", "previous", "previous_release", "promoted_at",
        "verdict", "who", "why",
    )  # fmt: skip
    out: dict[str, list[dict[str, Any]]] = {}
    for h in history:
        if isinstance(h, dict) and isinstance(h.get("run_id"), str):
            out.setdefault(h["run_id"], []).append(
                {k: h.get(k, "promote" if k == "action" else None) for k in keys}
            )
    return out


def list_run_ids(store: ArtifactStore, model: str) -> list[str]:
    """The model's run ids: the folders under ``runs/{model}/`` (not ``_index.json``)."""
    out = []
    for name in store.listdir(f"runs/{layout.safe_id(model, 'model')}"):
        try:
            out.append(layout.safe_id(name, "run id"))
        except BadInputError:
            continue
    return out


# -- writing -------------------------------------------------------------------------


def update(
    store: ArtifactStore, model: str, run_ids: Iterable[str] = (), *, rebuild: bool = False
) -> dict[str, Any]:
    """Bring the index up to date and write it if it changed; returns what it did.

    ``run_ids`` (the caller's own run) are rebuilt from their reports; so is every run
    with no entry or an entry that awaits its gate, and with ``rebuild`` every run. The
    write is a compare-and-swap on the version tag read: if another writer got in
    first, the update starts again from its index (up to :data:`ATTEMPTS` times).

    :raises ConflictError: another writer won every attempt.
    :raises BadInputError: the registry is not valid (its own message).
    """
    rel = layout.run_index(model)
    forced = set(run_ids)
    built: dict[str, dict[str, Any]] = {}  # kept across attempts: the reports do not change
    for _ in range(ATTEMPTS):
        etag = store.etag(rel)
        old: dict[str, Any] | None = None
        if etag is not None:
            try:
                old = _parse(store, rel, store.read_bytes(rel))
            except FileNotFoundError:
                continue  # removed between the two requests: start again
            except RunIndexError as e:
                log.warning("%s; rebuilding it from the reports", e)
        runs_before = {} if old is None or rebuild else old["runs"]
        present = list_run_ids(store, model)
        todo = [
            r
            for r in present
            if r not in built
            and (rebuild or r in forced or r not in runs_before or _awaiting(runs_before[r]))
        ]
        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(todo)))) as pool:
                for run_id, entry in zip(
                    todo, pool.map(lambda r: run_entry(store, model, r), todo), strict=True
                ):
                    built[run_id] = entry
        reg, _ = Registry(store, model).read()
        moves = _promotions(reg["history"] if reg else [])
        runs = {}
        for run_id in present:
            entry = built.get(run_id) or runs_before.get(run_id)
            if not isinstance(entry, dict):
                continue
            runs[run_id] = {**entry, "promotions": moves.get(run_id, [])}
        if old is not None and not rebuild and old["runs"] == runs:
            return {
                "index": store.url(rel),
                "runs": len(runs),
                "reindexed": len(todo),
                "written": False,
            }
        doc = {
            "format": FORMAT,
            "model": model,
            "updated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "runs": runs,
        }
        try:
            store.write_if_match(rel, json_bytes(doc), etag)
        except ConflictError:
            log.info("run index %s changed while updating it: trying again", store.url(rel))
            continue
        return {"index": store.url(rel), "runs": len(runs), "reindexed": len(todo), "written": True}
    raise ConflictError(
        f"run index {store.url(rel)}: another writer changed it {ATTEMPTS} times in a row"
    )


def record(store: ArtifactStore, model: str, run_id: str) -> None:
    """Update the index after a job's own writes, without ever failing the job.

    The index is derived: a failure here (the store refusing the write, a writer that
    kept winning the swap) is logged with the rebuild command and the job goes on; the
    next update repairs the entry. Only a stop signal (SIGTERM) goes through.
    """
    from embedfresh.core.cli import Terminated  # the job's stop signal must not be swallowed

    try:
        done = update(store, model, [run_id])
    except Terminated:
        raise
    except Exception as e:
        log.warning(
            "run index of %s not updated (%s: %s); the web UI shows this run after the next "
            "gate, promote or rollback of %s, or after: %s",
            model,
            type(e).__name__,
            e,
            model,
            REBUILD_COMMAND.format(root=store.root, model=model),
        )
        return
    log.info("run index %s: %d runs (%d re-read)", done["index"], done["runs"], done["reindexed"])
