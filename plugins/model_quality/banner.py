"""The page's banner: is production healthy, and why.

Built from :func:`embedfresh.plugins.model_quality.reports.overview`'s sections (the live
release with its corpora, the gate decisions, the newest runs' search checks) plus the
newest decision's own ``gate.json`` (one read: its metrics carry ``higher_is_better``,
``n_needed`` and the reference's source) and, inside the request, the refresh DAG's next
run from Airflow's metadata database. The reason sentence uses the gate report's numbers
and its sidedness, improvement-signed as the gate judges them
(:mod:`embedfresh.core.quality_chart`).

What is live is the release, never "the newest embedding run": a promote-anyway or a
rollback makes another release live, with its own embedding sets. When production is a
bare pointer (a registry written before releases, or a release without corpora), the
banner says that no verified embeddings are live.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from embedfresh.core import quality_chart
from embedfresh.core.storage import ArtifactStore
from embedfresh.plugins.model_quality import reports
from embedfresh.plugins.model_quality.reports import Section

log = logging.getLogger(__name__)

MINUS = "\u2212"


@dataclass
class Banner:
    production: str | None
    """The live model version."""
    release: str | None
    """The live release's id (None for a bare pointer of a registry from before releases)."""
    since: str | None
    moved: str
    """How the live release went live: after a gate's PASS, anyway, or by a rollback."""
    bare: str | None
    """Why production has no verified embeddings, when it has none."""
    live: str
    """The live release's embedding sets, index tables and search checks, in words."""
    run_id: str | None
    dag_id: str | None
    verdict: str | None
    sentence: str
    decided_at: str | None
    search: str | None
    """The newest decision's run's search checks and whether that run's release is live."""
    next_refresh: str


def signed(value: float) -> str:
    """+1.02% / −0.52%: a relative difference with its sign (a real minus)."""
    return f"{value:+.2%}".replace("-", MINUS)


def _interval(lo: float, hi: float) -> str:
    return f"[{signed(lo)}, {signed(hi)}]"


def _reference_words(gate: dict[str, Any]) -> str:
    reference = gate.get("reference")
    if isinstance(reference, dict):
        version, source = reference.get("version"), reference.get("source")
    else:
        version, source = reference, None
    if source == "production":
        return "production"
    if source == "baseline":  # the version of an untrained start is called "baseline"
        return "the baseline" if version in (None, "baseline") else f"the baseline {version}"
    return f"the reference {version}" if version else "the reference"


def _compared(m: dict[str, Any], ref: str) -> str | None:
    signed_d = quality_chart.improvement(m)
    if signed_d is None:
        return None
    g, lo, hi = signed_d
    way = "better" if g >= 0 else "worse"
    return f"{quality_chart.label(m.get('metric'))} is {abs(g):.2%} {way} than {ref} {_interval(lo, hi)}"


def verdict_sentence(gate: dict[str, Any]) -> str:
    """One sentence that says why the gate decided as it did, from its own numbers.

    FAIL names every failing metric, INCONCLUSIVE every undecided one with the eval-set
    size that would decide, PASS the metric closest to the SLA.
    """
    verdict = str(gate.get("verdict"))
    t = quality_chart.tolerance(gate)
    two_sided = quality_chart.is_two_sided(gate)
    ref = _reference_words(gate)
    sla = (
        f"parity allows ±{quality_chart.plain_pct(t)}"
        if two_sided
        else f"the SLA allows {quality_chart.plain_pct(t)}"
    )
    metrics = [m for m in gate.get("metrics") or [] if isinstance(m, dict)]
    if not metrics:
        return f"{verdict}: {gate.get('reason') or 'no metric in the report'}"
    if verdict == "PASS":
        scored = [(quality_chart.improvement(m), m) for m in metrics]
        scored = [(s, m) for s, m in scored if s is not None]
        if not scored:
            return f"every metric passed; {sla}"
        if two_sided:
            (g, lo, hi), m = max(scored, key=lambda sm: max(abs(sm[0][1]), abs(sm[0][2])))
            what = "the widest interval"
        else:
            (g, lo, hi), m = min(scored, key=lambda sm: sm[0][1])
            what = "the closest to the line"
        return (
            f"every metric is within the SLA: {what} is "
            f"{quality_chart.label(m.get('metric'))} at {signed(g)} {_interval(lo, hi)} "
            f"against {ref}; {sla}"
        )
    deciding = [m for m in metrics if str(m.get("verdict")) == verdict] or metrics
    parts = []
    for m in deciding:
        said = _compared(m, ref)
        if said is None:  # a metric missing from a side: the gate's own words
            parts.append(str(m.get("reason") or f"{m.get('metric')} has no interval"))
            continue
        if verdict == "INCONCLUSIVE" and m.get("n_needed"):
            n = int(m["n_needed"])
            said += (
                f" (the interval crosses the limit; about {n:,} examples would decide)"
                if not m.get("n_needed_capped")
                else " (the estimate sits on the limit: no practical eval set decides)"
            )
        parts.append(said)
    return "; ".join(parts) + f"; {sla}"


def next_refresh(dag_id: str) -> str:
    """When Airflow will create the refresh DAG's next run; "not known" when it cannot say.

    Read from Airflow's metadata database inside the request (the api-server's ORM),
    imported here: the plugin module is loaded by every component.
    """
    try:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        with create_session() as session:
            dag = session.get(DagModel, dag_id)
            if dag is None:
                return f"not known: {dag_id} is not in Airflow's database"
            if dag.is_paused:
                return f"none: {dag_id} is paused"
            when = dag.next_dagrun_create_after
            if when is None:
                return f"none scheduled for {dag_id}"
            return f"{when.isoformat(timespec='seconds')} ({dag_id})"
    except Exception as e:  # no database here (unit tests, a CLI): say so, never fail the page
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        log.debug("next run of %s not known", dag_id, exc_info=True)
        return f"not known ({type(e).__name__}: {first[:120]})"


def _ratio(value: Any) -> str:
    return f"{value:.2%}" if isinstance(value, int | float) else "not known"


def _figure(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else "not known"


def moved_words(data: dict[str, Any]) -> str:
    """How the live release went live, in words: the action, and a person's who and why."""
    action = data.get("action")
    person = f" by {data.get('who') or 'someone'}: {data.get('why') or 'no reason recorded'}"
    if action == "promote_anyway":
        return "promoted anyway (no gate's PASS)" + person
    if action == "rollback":
        earlier = data.get("previous_release") or data.get("previous")
        return f"rolled back from {earlier}" + person if earlier else "rolled back" + person
    verdict = (data.get("gate") or {}).get("verdict") or data.get("verdict")
    return f"released after the gate's {verdict}" if verdict else "released"


def bare_words(data: dict[str, Any]) -> str | None:
    """Why the live release carries no verified embeddings; None when it carries some."""
    if not data.get("bare"):
        return None
    effect = (
        "a search service reading the live release has no document vectors and no index "
        "table from it; the next refresh that passes (or Promote anyway, which embeds its "
        "corpora) makes a full release"
    )
    if data.get("legacy"):
        return (
            f"Production is a bare pointer to model version {data.get('version')}, from a "
            f"registry written before releases: no verified embeddings are live; {effect}."
        )
    return (
        f"Release {data.get('release')} carries no corpus embeddings (its corpora are "
        f"empty, as for a published base version): no verified embeddings are live; {effect}."
    )


def corpus_words(c: dict[str, Any]) -> str:
    """One corpus of the live release: rows, table, the search check and its figures."""
    emb, index, check = c.get("embeddings") or {}, c.get("index") or {}, c.get("search_check") or {}
    rows = f"{emb['rows']:,} rows" if isinstance(emb.get("rows"), int) else "rows not known"
    ndcg, judged = check.get("ndcg_at_10"), check.get("queries_judged", check.get("queries"))
    figures = (
        f"nDCG@10 {_figure(ndcg)} over {judged} judged queries"
        if ndcg is not None
        else "nDCG@10 not measured"
    ) + f", ANN recall {_ratio(check.get('ann_recall'))}"
    compared = check.get("compared_with")
    if isinstance(compared, dict):
        figures += (
            f"; release {compared.get('release')} had nDCG@10 {_figure(compared.get('ndcg_at_10'))}"
        )
    return (
        f"{c.get('corpus')}: {rows} in table {index.get('table')}, search check "
        f"{check.get('verdict') or 'not known'} ({figures})"
    )


def live_words(section: Section) -> str:
    """The live release's corpora in one line, or why there is nothing to say."""
    if not section.available:
        return section.message or "no live release"
    corpora = section.data.get("corpora") or []
    if not corpora:
        return "none: no verified embeddings are live"
    return "; ".join(corpus_words(c) for c in corpora)


def search_words(run_id: str | None, checks: Section, release: Section) -> str | None:
    """The search checks of run ``run_id`` (the newest decision's) and whether its release
    is live; None when that run has no search check (its gate stopped it, or it is older
    than the newest runs read)."""
    if run_id is None or not checks.available:
        return None
    rows = [r for r in checks.data if r.get("run_id") == run_id]
    if not rows:
        return None
    said = "; ".join(
        f"{r.get('verdict')} on {r.get('corpus')}"
        + (f" ({r.get('reason')})" if r.get("verdict") != "PASS" else "")
        for r in rows
    )
    live = release.data.get("release") if release.available else None
    if live == run_id:
        return f"search check {said}; release {run_id} is live"
    if any(r.get("verdict") != "PASS" for r in rows):
        return f"search check {said}; no release was made"
    return f"search check {said}; release {run_id} is not live"


def latest_gate(
    store: ArtifactStore, model: str, decisions: Section
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the newest decision row, its gate.json): the row from the section, the report read."""
    if not decisions.available or not decisions.data:
        return None, None
    row = decisions.data[0]
    try:
        gate = reports.gate_report(store, model, str(row["run_id"]))
    except Exception:
        log.warning("reading the newest gate report failed", exc_info=True)
        gate = None
    return row, gate


def build(
    sections: dict[str, Section],
    row: dict[str, Any] | None,
    gate: dict[str, Any] | None,
    dag_id: str,
) -> Banner:
    release = sections["release"]
    data = release.data if release.available else {}
    if row is None:
        sentence = sections["decisions"].message or "no gate decision yet"
    else:
        # The report itself when readable; else the row (same numbers, fewer fields).
        sentence = verdict_sentence(gate if gate is not None else row)
    run_id = row.get("run_id") if row else None
    return Banner(
        production=data.get("version"),
        release=data.get("release"),
        since=data.get("promoted_at"),
        moved=moved_words(data) if data else release.message,
        bare=bare_words(data) if data else None,
        live=live_words(release),
        run_id=run_id,
        dag_id=row.get("dag_id") if row else None,
        verdict=str(row.get("verdict")) if row else None,
        sentence=sentence,
        decided_at=row.get("created_at") if row else None,
        search=search_words(run_id, sections["search_checks"], release),
        next_refresh=next_refresh(dag_id),
    )
