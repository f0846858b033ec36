"""The "Model quality" HTML page, rendered on the server from the report sections.

Plain HTML and inline CSS: the page runs inside the Airflow UI's iframe (external view),
needs no build step and fetches nothing from the internet. Every value from the store
is escaped; every link is relative to the plugin's prefix so a reverse proxy path works.
"""

from __future__ import annotations

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
from embedfresh.plugins.model_quality.settings import REFRESH_DAG_ID

#: Run id prefixes Airflow gives DAG runs (DagRunType); other ids came from a shell.
AIRFLOW_RUN_PREFIXES = ("manual__", "scheduled__", "asset_triggered__", "backfill__")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #1f2328; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
.na { color: #656d76; font-style: italic; }
.problem { color: #cf222e; }
.verdict { font-weight: bold; }
nav a { margin-right: 12px; }
#banner { border: 1px solid #d0d7de; border-left-width: 6px; padding: 8px 14px; margin: 10px 0; }
#banner p { margin: 4px 0; }
#banner.verdict-pass { border-left-color: #1a7f37; }
#banner.verdict-fail { border-left-color: #cf222e; }
#banner.verdict-inconclusive { border-left-color: #9a6700; }
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


def verdict_html(verdict: Any) -> str:
    colour = VERDICT_COLOURS.get(str(verdict), "#1f2328")
    return f'<span class="verdict" style="color:{colour}">{_v(verdict)}</span>'


def dag_run_link(run_id: str, dag_id: str | None) -> str:
    """A link into the Airflow UI for runs made by a DAG; plain text otherwise."""
    dag = dag_id or (REFRESH_DAG_ID if run_id.startswith(AIRFLOW_RUN_PREFIXES) else None)
    if dag is None:
        return f"{escape(run_id)} <span class='na'>(not a DAG run)</span>"
    href = f"../dags/{quote(dag, safe='')}/runs/{quote(run_id, safe='')}"
    return f'<a href="{escape(href)}" target="_top">{escape(run_id)}</a>'


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


def _registry(data: dict[str, Any]) -> str:
    prod = data.get("production") or {}
    rows = [
        [
            _v(h.get("version")),
            _v(h.get("action", "promote")),
            verdict_html(h.get("verdict")),
            _v(h.get("mode")),
            _v(h.get("reference")),
            _v(h.get("previous")),
            _v(h.get("promoted_at")),
            _who_why(h),
            dag_run_link(str(h.get("run_id")), h.get("dag_id")) if h.get("run_id") else NA,
        ]
        for h in data.get("history") or []
    ]
    return (
        f'<p>Production version: <strong id="production-version">{_v(prod.get("version"))}'
        f"</strong>, promoted {_v(prod.get('promoted_at'))} "
        f"(registry <code>{_v(data.get('url'))}</code>)</p>"
        + table(
            [
                "version",
                "action",
                "verdict",
                "mode",
                "reference",
                "previous",
                "moved at",
                "who, why",
                "run",
            ],
            rows,
            "registry",
        )
    )


def _who_why(entry: dict[str, Any]) -> str:
    """A person's move (promote anyway, roll back) says who and why; a gated one neither."""
    if not entry.get("who") and not entry.get("why"):
        return NA
    return f"{_v(entry.get('who'))}: {_v(entry.get('why'))}"


def _overrides(offered: list[Override]) -> str:
    """Links to the override DAGs the user may trigger; nothing for anyone else."""
    if not offered:
        return ""
    links = "".join(
        f'<a class="override" id="override-{escape(o.action)}" target="_top" '
        f'href="../dags/{quote(o.dag_id, safe="")}" title="{escape(o.hint)}">'
        f"{escape(o.label)}</a> "
        for o in offered
    )
    return (
        f'<p id="overrides">Act on production: {links}'
        "<span class='na'>(opens the DAG in Airflow: Trigger, then give the version and a "
        "reason; recorded in the registry's history with your user name)</span></p>"
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
                _v(r.get("candidate")),
                _v(r.get("reference")),
                _v(r.get("n")),
                _metrics_cell(r.get("metrics") or []),
                _v(r.get("reason")),
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


def _banner(b: banner_data.Banner, offered: list[Override]) -> str:
    verdict = b.verdict or "none"
    run = f" in {dag_run_link(b.run_id, b.dag_id)}" if b.run_id else ""
    when = f" at {_v(b.decided_at)}" if b.decided_at else ""
    return (
        f'<section id="banner" class="verdict-{escape(verdict.lower())}">'
        f'<p>Production: <strong id="banner-production">{_v(b.production)}</strong>'
        f" since {_v(b.since)}</p>"
        f"<p>Last refresh: {verdict_html(b.verdict) if b.verdict else NA}{run}{when}: "
        f'<span id="banner-reason">{escape(b.sentence)}</span></p>'
        f'<p>Last embedding run: <span id="banner-embedding">{escape(b.embedding)}</span></p>'
        f'<p>Next scheduled refresh: <span id="banner-next">{escape(b.next_refresh)}</span></p>'
        f"{_overrides(offered)}</section>"
    )


def _history(rows: list[dict[str, Any]]) -> str:
    return (
        '<div id="history-chart" class="chart">'
        + _chart(lambda: (charts.history_chart(rows), f"{len(rows)} gate decisions, newest mode"))
        + "</div>"
    )


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
                _v(r.get("run_id")),
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


def _embeddings(runs: list[dict[str, Any]]) -> str:
    return table(
        ["version", "corpus", "rows", "parts", "sentences/s", "manifest", "at"],
        [
            [
                _v(r.get("version")),
                _v(r.get("corpus")),
                _v(r.get("rows")),
                _v(r.get("parts")),
                _v(r.get("sentences_per_s")),
                _v(r.get("status")),
                _v(r.get("created_at")),
            ]
            for r in runs
        ],
        "embeddings",
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
                _v(r.get("run_id")),
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
    the banner."""
    store = store if store is not None else ArtifactStore(root)
    row, gate = banner_data.latest_gate(store, model, sections["decisions"])
    top = _banner(banner_data.build(sections, row, gate, REFRESH_DAG_ID), overrides or [])

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
            _section("Registry", sections["registry"], _registry),
            _section("Gate decisions", sections["decisions"], _decisions),
            _section("Latest candidate vs reference (evaluation curve)", sections["curve"], curve),
            _section(
                "History: d per metric across gate decisions", sections["decisions"], _history
            ),
            _section("Health (latest per host and rank)", sections["health"], _health),
            _section("Compile cache", sections["compile_cache"], _compile_cache),
            _section("Embedding runs", sections["embeddings"], _embeddings),
            _section(
                "Cost of the newest runs (every attempt, on the runner's clock)",
                sections["costs"],
                _costs,
            ),
        ]
    )
    return document(
        f"Model quality: {model}",
        f"<nav>Models: {nav}</nav>{top}<p class='na'>artifact store {escape(root)}</p>{body}",
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
