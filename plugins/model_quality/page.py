"""The "Model quality" HTML page, rendered on the server from the report sections.

Plain HTML and inline CSS: the page runs inside the Airflow UI's iframe (external view),
needs no build step and fetches nothing from the internet. Every value from the store
is escaped; every link is relative to the plugin's prefix so a reverse proxy path works.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote

from embedfresh.core import quality_chart
from embedfresh.core.storage import ArtifactStore
from embedfresh.plugins.model_quality import banner as banner_data
from embedfresh.plugins.model_quality import chart as charts
from embedfresh.plugins.model_quality.actions import Override
from embedfresh.plugins.model_quality.chart import VERDICT_COLOURS
from embedfresh.plugins.model_quality.reports import Section
from embedfresh.plugins.model_quality.settings import OVERRIDE_DAG_IDS, REFRESH_DAG_ID

#: Run id prefixes Airflow gives DAG runs (DagRunType); other ids came from a shell.
AIRFLOW_RUN_PREFIXES = ("manual__", "scheduled__", "asset_triggered__", "backfill__")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #1f2328;
       overflow-wrap: break-word; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; max-width: 100%; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
.id, .text, code { overflow-wrap: anywhere; }
.na { color: #656d76; font-style: italic; }
.problem { color: #cf222e; }
.warning { color: #9a6700; font-weight: bold; }
.verdict { font-weight: bold; }
nav a { margin-right: 12px; }
#banner { border: 1px solid #d0d7de; border-left-width: 6px; padding: 8px 14px; margin: 10px 0; }
#banner p { margin: 4px 0; }
#banner.verdict-pass { border-left-color: #1a7f37; }
#banner.verdict-fail { border-left-color: #cf222e; }
#banner.verdict-inconclusive { border-left-color: #9a6700; }
#banner.bare { border-left-color: #9a6700; border-top: 4px solid #9a6700; }
.chart svg { max-width: 100%; height: auto; }
"""

NA = '<span class="na">not available</span>'


def _v(value: Any) -> str:
    """A cell value: escaped, or "not available" for a missing one."""
    if value is None or value == "":
        return NA
    if isinstance(value, float):
        return f"{value:.6g}"
    return escape(str(value))


def _pct(value: Any) -> str:
    return f"{value:+.3%}" if isinstance(value, int | float) else NA


def _id(value: Any, tag: str = "span") -> str:
    """An id, a table name or a URL: one long word, which may break anywhere so that a
    column of them never widens the page past the window."""
    return NA if value is None or value == "" else f'<{tag} class="id">{escape(str(value))}</{tag}>'


def _text(value: Any) -> str:
    """Free text from a report or a person (a reason, a why): it may hold a URL, which
    breaks anywhere rather than widening its column."""
    return NA if value is None or value == "" else f'<span class="text">{escape(str(value))}</span>'


def _ratio(value: Any) -> str:
    return f"{value:.2%}" if isinstance(value, int | float) else NA


def _ms(value: Any) -> str:
    return f"{value:.3g} ms" if isinstance(value, int | float) else NA


def verdict_html(verdict: Any) -> str:
    colour = VERDICT_COLOURS.get(str(verdict), "#1f2328")
    return f'<span class="verdict" style="color:{colour}">{_v(verdict)}</span>'


def dag_run_link(run_id: str, dag_id: str | None) -> str:
    """A link into the Airflow UI for runs made by a DAG; plain text otherwise."""
    dag = dag_id or (REFRESH_DAG_ID if run_id.startswith(AIRFLOW_RUN_PREFIXES) else None)
    if dag is None:
        return f"{_id(run_id)} <span class='na'>(not a DAG run)</span>"
    href = f"../dags/{quote(dag, safe='')}/runs/{quote(run_id, safe='')}"
    return f'<a class="id" href="{escape(href)}" target="_top">{escape(run_id)}</a>'


def move_run_link(entry: dict[str, Any]) -> str:
    """The run that moved the registry: a refresh's, or an override DAG's (promote anyway,
    roll back) whose run ids look like any manual run's."""
    run_id = entry.get("run_id")
    if not run_id:
        return NA
    dag_id = entry.get("dag_id") or OVERRIDE_DAG_IDS.get(str(entry.get("action")))
    if dag_id is None and not str(run_id).startswith(AIRFLOW_RUN_PREFIXES):
        return dag_run_link(str(run_id), None)
    return dag_run_link(str(run_id), dag_id)


def table(headers: list[str], rows: list[list[str]], css_id: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{css_id}"' if css_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(title: str, section: Section, body) -> str:
    problems = "".join(f'<p class="problem">{escape(p)}</p>' for p in section.problems)
    content = (
        body(section.data) if section.available else f'<p class="na">{escape(section.message)}</p>'
    )
    return f"<section><h2>{escape(title)}</h2>{content}{problems}</section>"


def _metrics_cell(metrics: list[dict[str, Any]]) -> str:
    """Each metric's difference and interval, improvement-signed (above 0 is better, for
    log-loss too), as the charts and the banner show them."""
    if not metrics:
        return NA

    def one(m: dict[str, Any]) -> str:
        signed = quality_chart.improvement(m)
        d, lo, hi = signed if signed else (m.get("d"), m.get("ci_low"), m.get("ci_high"))
        return (
            f"{escape(quality_chart.label(m.get('metric')))}: {_pct(d)} "
            f"[{_pct(lo)}, {_pct(hi)}] {verdict_html(m.get('verdict'))}"
        )

    return "<br>".join(one(m) for m in metrics)


def _settings(settings: dict[str, Any]) -> str:
    """How the vectors were embedded, one ``key value`` per setting (lists counted)."""
    parts = []
    for key, value in settings.items():
        if isinstance(value, list | dict):
            value = f"{len(value)} item(s)" if value else None
        parts.append(f"{escape(str(key))} {'none' if value in (None, '') else _v(value)}")
    return ", ".join(parts) if parts else NA


def _ann(ann: Any) -> str:
    if not isinstance(ann, dict) or not ann:
        return NA
    keys = ("m", "ef_construction", "ef_search")
    return "HNSW " + ", ".join(f"{k} {_v(ann.get(k))}" for k in keys if k in ann)


def _queries(check: dict[str, Any]) -> str:
    """How many queries searched the index, and how many judged queries nDCG@10 was
    compared on (the looks grow it while the comparison is open)."""
    judged = check.get("queries_judged")
    said = _v(check.get("queries"))
    return f"{said}, nDCG@10 on {_v(judged)} judged" if judged is not None else said


def _ndcg(check: dict[str, Any]) -> str:
    ndcg = check.get("ndcg_at_10")
    if ndcg is None:
        return "not measured"
    judged = check.get("judged_at_10")
    return _v(ndcg) + (f" (judged@10 {_v(judged)})" if judged is not None and judged < 1 else "")


def _corpus_row(c: dict[str, Any]) -> str:
    """One corpus of the live release: its embedding set, index table and search check."""
    emb, index = c.get("embeddings") or {}, c.get("index") or {}
    check = c.get("search_check") or {}
    sha = str(emb.get("manifest_sha256") or "")
    embedding = (
        f"{_v(emb.get('rows'))} rows of {_v(emb.get('hidden'))} dimensions<br>"
        f"{_settings(emb.get('settings') or {})}<br>"
        f"manifest {_id(emb.get('manifest'), 'code')}<br>"
        f'sha256 <code title="{escape(sha)}">{escape(sha[:16]) or NA}</code>'
    )
    table_cell = (
        f"{_id(index.get('table'), 'code')}<br>live view {_id(index.get('live_view'), 'code')}<br>"
        f"{_v(index.get('kind'))} at {_id(index.get('location'), 'code')}<br>{_ann(index.get('ann'))}"
    )
    compared = check.get("compared_with")
    regression = check.get("regression") or {}
    if isinstance(compared, dict):
        against = (
            f"against release {_id(compared.get('release'))} (version "
            f"{_id(compared.get('version'))}, table {_id(compared.get('table'), 'code')}): "
            f"nDCG@10 {_v(compared.get('ndcg_at_10'))}; "
            f"{verdict_html(regression.get('verdict'))} ({_v(regression.get('mode'))})"
        )
    else:
        against = f"not compared: {_text(regression.get('reason'))}"
    latency = check.get("latency_ms") if isinstance(check.get("latency_ms"), dict) else {}
    figures = (
        f"queries {_queries(check)}<br>ANN recall {_ratio(check.get('ann_recall'))} (at least "
        f"{_ratio(check.get('min_ann_recall'))})<br>nDCG@10 {_ndcg(check)}<br>{against}<br>latency p50 {_ms(latency.get('p50'))}, p99 {_ms(latency.get('p99'))}"
        f"<br>report {_id(check.get('report'), 'code')}"
    )
    return (
        f'<tr id="release-corpus-{escape(str(c.get("corpus")))}">'
        f"<td>{_v(c.get('corpus'))}</td><td>{embedding}</td><td>{table_cell}</td>"
        f"<td>{verdict_html(check.get('verdict'))} {_text(check.get('reason'))}</td>"
        f"<td>{figures}</td></tr>"
    )


def _age(facts: dict[str, Any]) -> str:
    """Production's age: the days of data it has not trained on (stale past the limit)."""
    age = facts.get("age_days")
    if age is None:
        return (
            '<p class="na" id="production-age">Production\'s age: not known (its model '
            "was not trained on dated data)</p>"
        )
    stale = facts.get("stale")
    return (
        f'<p class="{"warning" if stale else "na"}" id="production-age">Production\'s age: '
        f"{_v(age)} days of data (trained through {_v(facts.get('trained_through'))}, newest "
        f"data {_v(facts.get('newest_data'))}"
        + (f"; stale: over the {_v(facts.get('stale_after_days'))}-day limit" if stale else "")
        + ")</p>"
    )


def _live_release(data: dict[str, Any]) -> str:
    """The live release: its model version, how it went live, and per corpus the embedding
    set, the index table and the search check's figures."""
    gate = data.get("gate") or {}
    if data.get("legacy"):
        head = (
            f'<p id="live-release">No release: production is model version '
            f'<strong class="id" id="production-version">{escape(str(data.get("version")))}'
            f"</strong>, a bare pointer from a registry written before releases"
        )
    else:
        head = (
            f'<p id="live-release">Release <strong class="id" id="release-id">'
            f"{escape(str(data.get('release')))}</strong>: model version "
            f'<strong class="id" id="production-version">{escape(str(data.get("version")))}'
            "</strong>"
        )
    head += (
        f", live since {_v(data.get('promoted_at'))}: "
        f"{escape(banner_data.moved_words(data))}"
        + (f" ({_v(gate.get('mode'))}, run {move_run_link(data)})" if gate else "")
        + (f" (run {move_run_link(data)})" if not gate and data.get("run_id") else "")
        + "</p><p class='na'>"
        + (f"release document {_id(data.get('url'), 'code')}; " if data.get("url") else "")
        + f"registry {_id(data.get('registry'), 'code')}</p>"
    )
    head += _age(data.get("freshness") or {})
    if data.get("bare"):
        return (
            head
            + f'<p class="warning" id="release-bare">{escape(banner_data.bare_words(data) or "")}</p>'
        )
    rows = "".join(_corpus_row(c) for c in data.get("corpora") or [])
    headers = ["corpus", "embedding set", "index table", "search check", "figures"]
    head_html = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return (
        head + f'<table id="release-corpora"><thead><tr>{head_html}</tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def _retention(release_id: Any, data: dict[str, Any], rollback: bool) -> str:
    """Where a release stands with retention: live, kept (a rollback reaches it; with the
    param to give when the user may roll back) or past retention."""
    if not release_id:
        return '<span class="na">bare pointer (before releases)</span>'
    kept = data.get("kept") or []
    if kept and release_id == kept[0]:
        return "<strong>live</strong>"
    if release_id in kept:
        said = "kept: rollback possible"
        if rollback:
            said += f'<br><code class="id">release={escape(str(release_id))}</code>'
        return said
    return f'<span class="na">past retention (keeps {_v(data.get("keep"))})</span>'


def _registry(data: dict[str, Any], offered: list[Override] | None = None) -> str:
    """Every move of the live release, newest first, with where each release stands with
    retention (kept ones are marked; a rollback reaches only those)."""
    rollback = any(o.action == "rollback" for o in offered or [])
    rows = []
    for h in data.get("history") or []:
        release_id = h.get("release")
        version = h.get("version")
        what = _id(release_id) if release_id else NA
        if version and version != release_id:
            what += f"<br>version {_id(version)}"
        corpora = h.get("corpora")
        if release_id is None:
            corpora_cell = '<span class="na">none: bare pointer</span>'
        elif not corpora:
            corpora_cell = '<span class="warning">none</span>'
        else:
            corpora_cell = escape(", ".join(str(c) for c in corpora))
        previous = h.get("previous_release") or h.get("previous")
        rows.append(
            [
                what,
                corpora_cell,
                f"{_v(h.get('action', 'promote'))}<br>{verdict_html(h.get('verdict'))}"
                if h.get("verdict")
                else _v(h.get("action", "promote")),
                _id(previous),
                _v(h.get("promoted_at")),
                _who_why(h),
                move_run_link(h),
                _retention(release_id, data, rollback),
            ]
        )
    kept = data.get("kept") or []
    return (
        f"<p>Retention keeps the last {_v(data.get('keep'))} releases "
        f"(<code>$EMBEDFRESH_KEEP_RELEASES</code>): live {_id(kept[0] if kept else None)}; "
        f"kept before it: {', '.join(_id(k) for k in kept[1:]) or 'none'}; registry "
        f"{_id(data.get('url'), 'code')}</p>"
        + table(
            [
                "release",
                "corpora",
                "action",
                "previous",
                "moved at",
                "who, why",
                "run",
                "retention",
            ],
            rows,
            "registry",
        )
    )


def _who_why(entry: dict[str, Any]) -> str:
    """A person's move (promote anyway, roll back) says who and why; a gated one neither."""
    if not entry.get("who") and not entry.get("why"):
        return NA
    return f"{_id(entry.get('who'))}: {_text(entry.get('why'))}"


def override_conf(
    action: str, model: str, release: dict[str, Any], registry: dict[str, Any], candidate: Any
) -> dict[str, Any]:
    """The Params to give an override DAG's Trigger form, as far as the page knows them:
    promote anyway a ``version`` (the newest candidate when it is not live) with
    ``corpora`` (the live release's), roll back to a ``release`` (the newest kept before
    the live one). ``reason`` is always the person's to write."""
    if action == "rollback":
        kept = registry.get("kept") or []
        return {"model": model, "release": kept[1] if len(kept) > 1 else "", "reason": ""}
    corpora = [c.get("corpus") for c in release.get("corpora") or []] or ["products"]
    version = candidate if candidate and candidate != release.get("version") else ""
    return {"model": model, "version": version, "corpora": corpora, "reason": ""}


def _overrides(offered: list[Override], confs: dict[str, dict[str, Any]]) -> str:
    """Links to the override DAGs the user may trigger, each with the Params its Trigger
    form asks for; nothing for anyone else.

    Airflow 3's UI opens the Trigger form from the DAG's page and cannot prefill it from a
    URL, so the Params are shown to copy (the form's fields, or its configuration JSON).
    """
    if not offered:
        return ""
    links = "".join(
        f'<span class="override-item"><a class="override" id="override-{escape(o.action)}" '
        f'target="_top" href="../dags/{quote(o.dag_id, safe="")}" title="{escape(o.hint)}">'
        f"{escape(o.label)}</a> "
        f'<code class="id" id="override-conf-{escape(o.action)}">'
        f"{escape(json.dumps(confs.get(o.action, {})))}</code></span> "
        for o in offered
    )
    return (
        f'<p id="overrides">Act on production: {links}'
        "<span class='na'>(opens the DAG in Airflow: Trigger, then give these Params, the "
        "blank ones and a reason too; recorded in the registry's history with your user "
        "name)</span></p>"
    )


def _decisions(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "run",
            "verdict",
            "mode",
            "candidate",
            "reference",
            "n",
            "difference and 95% interval (above 0: better)",
            "reason",
        ],
        [
            [
                dag_run_link(r["run_id"], r.get("dag_id")),
                verdict_html(r.get("verdict")),
                _v(r.get("mode")),
                _id(r.get("candidate")),
                _id(r.get("reference")),
                _v(r.get("n")),
                _metrics_cell(r.get("metrics") or []),
                _text(r.get("reason")) + _not_compared(r.get("metrics_not_compared")),
            ]
            for r in rows
        ],
        "decisions",
    )


def _chart(make) -> str:
    """A rendered chart, or why not: a chart failing never fails the page."""
    try:
        svg, source = make()
    except Exception as e:
        return f'<p class="problem">chart not available: {escape(type(e).__name__)}: {escape(str(e))}</p>'
    return f'{svg}<p class="na">chart: {escape(source)}</p>'


def _banner(b: banner_data.Banner, overrides: str) -> str:
    verdict = b.verdict or "none"
    run = f" in {dag_run_link(b.run_id, b.dag_id)}" if b.run_id else ""
    when = f" at {_v(b.decided_at)}" if b.decided_at else ""
    release = (
        f'release <strong class="id" id="banner-release">{escape(b.release)}</strong>, model '
        f"version "
        if b.release
        else "model version "
    )
    bare = (
        f'<p class="warning" id="banner-bare">{escape(b.bare)}</p>'
        if b.bare
        else f'<p>Live embeddings: <span id="banner-embeddings">{escape(b.live)}</span></p>'
    )
    search = f'; <span id="banner-search">{escape(b.search)}</span>' if b.search else ""
    classes = f"verdict-{escape(verdict.lower())}" + (" bare" if b.bare else "")
    return (
        f'<section id="banner" class="{classes}">'
        f'<p>Production: {release}<strong class="id" id="banner-production">'
        f"{_v(b.production)}</strong> since {_v(b.since)}: "
        f'<span id="banner-moved">{escape(b.moved)}</span></p>'
        f"{bare}"
        f"<p>Last refresh: {verdict_html(b.verdict) if b.verdict else NA}{run}{when}: "
        f'<span id="banner-reason">{escape(b.sentence)}</span>{search}</p>'
        f'<p>Next scheduled refresh: <span id="banner-next">{escape(b.next_refresh)}</span></p>'
        f"{overrides}</section>"
    )


def _history(rows: list[dict[str, Any]]) -> str:
    return (
        '<div id="history-chart" class="chart">'
        + _chart(lambda: (charts.history_chart(rows), f"{len(rows)} gate decisions, newest mode"))
        + "</div>"
    )


def _not_compared(skipped: Any) -> str:
    """The metrics a gate left out, and why, under its reason."""
    if not isinstance(skipped, dict) or not skipped:
        return ""
    why = "; ".join(sorted({str(v) for v in skipped.values()}))
    names = ", ".join(quality_chart.label(m) for m in skipped)
    return f'<br><span class="not-compared">not compared: {escape(names)} ({_text(why)})</span>'


def _curve(data: dict[str, Any], chart_html: str = "") -> str:
    final = data["points"][-1]["metrics"] if data.get("points") else []

    def row(m: dict[str, Any]) -> list[str]:
        signed = quality_chart.improvement(m)
        d, lo, hi = signed if signed else (m.get("d"), m.get("ci_low"), m.get("ci_high"))
        return [
            _v(quality_chart.label(m.get("metric"))),
            _v(m.get("m_cand")),
            _v(m.get("m_ref")),
            _pct(d),
            f"[{_pct(lo)}, {_pct(hi)}]",
            verdict_html(m.get("verdict")),
        ]

    values = table(
        [
            "metric",
            "candidate",
            "reference",
            "difference (above 0: better)",
            "95% interval",
            "verdict",
        ],
        [row(m) for m in final],
        "curve-values",
    )
    return f'<div id="chart" class="chart">{chart_html}</div>{values}'


def _checks_cell(checks: list[dict[str, Any]]) -> str:
    """Failed checks in full, passed ones folded away (a rank runs dozens)."""
    if not checks:
        return NA
    failed = [c for c in checks if not c.get("passed")]
    lines = [
        f"{'PASS' if c.get('passed') else 'FAIL'} {_v(c.get('name'))}"
        + (f": {_v(c.get('detail'))}" if c.get("detail") else "")
        for c in checks
    ]
    summary = f"{len(checks) - len(failed)} of {len(checks)} checks passed"
    shown = "".join(
        f"<br>{verdict_html('FAIL')} {_v(c.get('name'))}: {_v(c.get('detail'))}" for c in failed
    )
    return f"{summary}{shown}<details><summary>all checks</summary>{'<br>'.join(lines)}</details>"


def _health(data: dict[str, Any]) -> str:
    ranks = table(
        ["host", "rank", "device", "run", "at", "checks"],
        [
            [
                _v(r.get("host")),
                _v(r.get("rank")),
                _v(r.get("device")),
                _id(r.get("run_id")),
                _v(r.get("created_at")),
                _checks_cell(r.get("checks") or []),
            ]
            for r in data.get("ranks") or []
        ],
        "health-ranks",
    )
    collectives = table(
        ["op", "size (bytes)", "algbw (GB/s)", "busbw (GB/s)", "passed"],
        [
            [
                _v(c.get("op")),
                _v(c.get("size_bytes")),
                _v(c.get("algbw_gbps")),
                _v(c.get("busbw_gbps")),
                _v(c.get("passed")),
            ]
            for c in data.get("collectives") or []
        ],
        "health-collectives",
    )
    failed = ", ".join(escape(str(f)) for f in data.get("failed") or []) or "none"
    return (
        f"<p id='health-verdict'>Latest verdict {verdict_html(data.get('verdict'))} on {_v(data.get('backend'))}, "
        f"world size {_v(data.get('world_size'))}, run {_v(data.get('run_id'))} "
        f"at {_v(data.get('created_at'))}; failed: {failed}</p>{ranks}"
        + (collectives if data.get("collectives") else '<p class="na">no collectives measured</p>')
    )


EAGER = "not compiled (eager)"


def _eager(history: list[dict[str, Any]]) -> bool:
    """Every run of the entry ran eagerly: there was nothing to compile, nothing missed."""
    return bool(history) and all(h.get("mode") == "eager" for h in history)


def _compile_cache(entries: list[dict[str, Any]]) -> str:
    def one(h: dict[str, Any]) -> str:
        if h.get("mode") == "eager":
            return f"{_v(h.get('run_id'))}: {EAGER}"
        seconds = (
            h.get("warm_seconds_to_first_step")
            if h.get("cache_hit")
            else h.get("cold_seconds_to_first_step")
        )
        return (
            f"{_v(h.get('run_id'))}: {'hit' if h.get('cache_hit') else 'miss'}"
            f" ({_v(h.get('graphs'))} graphs, first step {_v(seconds)} s)"
        )

    def hits(history: list[dict[str, Any]]) -> str:
        return "<br>".join(one(h) for h in history) if history else NA

    def committed(e: dict[str, Any]) -> str:
        if e.get("committed"):
            return "yes"
        return EAGER if _eager(e.get("history") or []) else "no"

    def size(e: dict[str, Any]) -> str:
        if not e.get("committed") and _eager(e.get("history") or []):
            return EAGER
        return _v(e.get("size_bytes"))

    return table(
        ["backend", "key", "committed", "size (bytes)", "hit/miss history"],
        [
            [
                _v(e.get("backend")),
                f"<code>{_v(e.get('key'))}</code>",
                committed(e),
                size(e),
                hits(e.get("history") or []),
            ]
            for e in entries
        ],
        "compile-cache",
    )


def _embeddings(runs: list[dict[str, Any]], live: dict[str, Any] | None = None) -> str:
    """Every embedding run; the sets the live release carries say so (a set not live is
    not what search serves, however new)."""
    live = live or {}
    carried = {c.get("corpus") for c in live.get("corpora") or []}

    def in_live(r: dict[str, Any]) -> str:
        if r.get("version") == live.get("version") and r.get("corpus") in carried:
            return f"<strong>live</strong> (release {_id(live.get('release'))})"
        return '<span class="na">no</span>'

    return table(
        ["version", "corpus", "rows", "parts", "sentences/s", "manifest", "at", "live"],
        [
            [
                _id(r.get("version")),
                _v(r.get("corpus")),
                _v(r.get("rows")),
                _v(r.get("parts")),
                _v(r.get("sentences_per_s")),
                _v(r.get("status")),
                _v(r.get("created_at")),
                in_live(r),
            ]
            for r in runs
        ],
        "embeddings",
    )


def _search_checks(rows: list[dict[str, Any]], live: dict[str, Any] | None = None) -> str:
    """The newest runs' search checks: a failed one explains why its run made no release."""
    live_id = (live or {}).get("release")

    def compared(r: dict[str, Any]) -> str:
        w = r.get("compared_with")
        regression = r.get("regression") or {}
        if not isinstance(w, dict):
            return f"{verdict_html(regression.get('verdict'))} {_text(regression.get('reason'))}"
        return (
            f"release {_id(w.get('release'))}: nDCG@10 {_v(w.get('ndcg_at_10'))}; "
            f"{verdict_html(regression.get('verdict'))} ({_v(regression.get('mode'))})"
        )

    def latency(r: dict[str, Any]) -> str:
        ms = r.get("latency_ms") if isinstance(r.get("latency_ms"), dict) else {}
        return f"p50 {_ms(ms.get('p50'))}<br>p99 {_ms(ms.get('p99'))}"

    return table(
        [
            "run",
            "corpus",
            "verdict",
            "queries",
            "ANN recall",
            "nDCG@10",
            "compared with",
            "latency",
            "reason",
        ],
        [
            [
                dag_run_link(str(r["run_id"]), None)
                + (" <strong>(live)</strong>" if r.get("run_id") == live_id else ""),
                _v(r.get("corpus")),
                verdict_html(r.get("verdict")),
                _queries(r),
                f"{_ratio(r.get('ann_recall'))} (at least {_ratio(r.get('min_ann_recall'))})",
                _ndcg(r),
                compared(r),
                latency(r),
                _text(r.get("reason")),
            ]
            for r in rows
        ],
        "search-checks",
    )


def _costs(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "run",
            "jobs",
            "attempts",
            "failed",
            "seconds",
            "instance-hours",
            "estimated $",
            "as",
            "runner",
            "costliest",
        ],
        [
            [
                _id(r.get("run_id")),
                _v(r.get("executions")),
                _v(r.get("attempts")),
                _v(r.get("failed_attempts")),
                _v(r.get("seconds")),
                _v(r.get("instance_hours")),
                _v(r.get("estimated_cost_usd")),
                _v(", ".join(r.get("instance_types") or [])),
                _v(", ".join(r.get("runners") or [])),
                _v(r.get("costliest")),
            ]
            for r in rows
        ],
        "costs",
    )


def render_page(
    model: str,
    models: list[str],
    sections: dict[str, Section],
    root: str,
    store: ArtifactStore | None = None,
    overrides: list[Override] | None = None,
) -> str:
    """The page: the banner, then one section each; ``store`` (else one opened on
    ``root``) serves the newest decision's gate.json and its stored chart; ``overrides``
    are the override DAGs the user may trigger (:func:`~.actions.permitted`), linked from
    the banner with the Params to give."""
    store = store if store is not None else ArtifactStore(root)
    offered = overrides or []
    row, gate = banner_data.latest_gate(store, model, sections["decisions"])
    live = sections["release"].data if sections["release"].available else {}
    registry = sections["registry"].data if sections["registry"].available else {}
    confs = {
        o.action: override_conf(o.action, model, live, registry, row and row.get("candidate"))
        for o in offered
    }
    top = _banner(
        banner_data.build(sections, row, gate, REFRESH_DAG_ID), _overrides(offered, confs)
    )

    def curve(data: dict[str, Any]) -> str:
        source = gate if gate is not None and row and row["run_id"] == data.get("run_id") else data
        chart_html = _chart(
            lambda: charts.decision_chart(store, model, str(data.get("run_id")), source)
        )
        return _curve(data, chart_html)

    nav = "".join(
        f'<a href="?model={quote(m, safe="")}">{"<strong>" + escape(m) + "</strong>" if m == model else escape(m)}</a>'
        for m in models
    )
    body = "".join(
        [
            _section("Live release", sections["release"], _live_release),
            _section(
                "Release history (the registry's moves, newest first)",
                sections["registry"],
                lambda data: _registry(data, offered),
            ),
            _section("Gate decisions", sections["decisions"], _decisions),
            _section("Latest candidate vs reference (evaluation curve)", sections["curve"], curve),
            _section(
                "History: d per metric across gate decisions", sections["decisions"], _history
            ),
            _section(
                "Search checks of the newest runs",
                sections["search_checks"],
                lambda rows: _search_checks(rows, live),
            ),
            _section("Health (latest per host and rank)", sections["health"], _health),
            _section("Compile cache", sections["compile_cache"], _compile_cache),
            _section(
                "Embedding runs", sections["embeddings"], lambda runs: _embeddings(runs, live)
            ),
            _section(
                "Cost of the newest runs (every attempt, on the runner's clock)",
                sections["costs"],
                _costs,
            ),
        ]
    )
    return document(
        f"Model quality: {model}",
        f"<nav>Models: {nav}</nav>{top}<p class='na'>artifact store {_id(root)}</p>{body}",
    )


def document(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>{body}</body></html>"
    )


def message_page(title: str, message: str, link: tuple[str, str] | None = None) -> str:
    """An error or notice as a page: the message, never a stack trace."""
    extra = (
        f'<p><a href="{escape(link[0])}" target="_top">{escape(link[1])}</a></p>' if link else ""
    )
    return document(title, f'<p class="problem" id="message">{escape(message)}</p>{extra}')
