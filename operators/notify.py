"""People are told: Airflow notifiers for the pipeline's decisions and incidents.

Two channels, each Airflow's own machinery:

- **e-mail** with the SMTP provider's ``SmtpNotifier`` and an Airflow connection of type
  ``smtp``;
- a **webhook** taking Slack-compatible JSON (``{"text": ..., "blocks": [...]}``), posted
  with the HTTP provider's ``HttpNotifier`` to an Airflow connection of type ``http`` whose
  host is the whole webhook URL (``https://hooks.slack.com/services/T.../B.../...``;
  put any port inside that URL, not in the connection's port field).

A deployment turns them on with environment settings, read when a DAG file is parsed:

- ``EMBEDFRESH_NOTIFY_EMAIL``: recipients, comma-separated; empty: no e-mail.
- ``EMBEDFRESH_NOTIFY_SMTP_CONN_ID``: the SMTP connection; default the provider's
  (``[email] email_conn_id``, else ``smtp_default``).
- ``EMBEDFRESH_NOTIFY_FROM``: the sender; default ``[email] from_email``, else the
  connection's ``from_email`` extra.
- ``EMBEDFRESH_NOTIFY_WEBHOOK_CONN_ID``: the webhook's HTTP connection; empty: no webhook.
- ``EMBEDFRESH_NOTIFY_WEBHOOK_BLOCKS``: ``false`` posts ``text`` only (for receivers that
  refuse Slack blocks); default ``true``.

A DAG asks for an event's notifiers and gets an empty list when nothing is configured, so
the same DAG file is silent on a laptop::

    QualityGateOperator(..., on_success_callback=notifiers("gate"))
    DAG(..., on_failure_callback=notifiers("run_failed"))
    RollbackOperator(..., on_success_callback=notifiers("rollback"),
                     on_failure_callback=notifiers("rollback"))  # says FAILED then

An invalid setting (a malformed address, a connection id Airflow would refuse) raises
``ValueError`` naming the variable, so the DAG file fails to import with the reason.

Events (:data:`EVENTS`), each with a plain-text message whose subject says the decision:

- ``gate``: the gate task's decision (its ``return_value`` XCom, read from the context
  the callback is given). A PASS sends nothing. FAIL or INCONCLUSIVE: each metric's
  ``d`` and interval in percent, the reason, a link to the web UI's Model quality page.
- ``run_failed``: the DAG, the run, its failed tasks, the log of the task the callback
  is about.
- ``promote_anyway`` and ``rollback``: who (the user who triggered the run) and why (the
  run's ``reason``), for the task that moved the live release.
- ``stale``: the refresh's ``freshness`` task found production older than
  ``EMBEDFRESH_STALE_AFTER_DAYS`` (default 3) days of data: its age, and each run since
  the live release that did not release, with its decisions (nothing when fresh).

A deadline breach is not a callback with a task context: the Deadline Alert's callback
(:func:`embedfresh.operators.deadline.record_deadline_breach`) calls
:func:`notify_deadline_breach` with what it knows.

The message builders (:func:`gate_message`, :func:`run_failed_message`,
:func:`override_message`, :func:`deadline_message`) are plain functions of data, usable
without Airflow running.
"""

from __future__ import annotations

import abc
import datetime as dt
import html
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseNotifier

from embedfresh.operators import links

log = logging.getLogger(__name__)

#: Recipients of the e-mails, comma-separated (``;`` works too); empty: no e-mail.
EMAIL_ENV = "EMBEDFRESH_NOTIFY_EMAIL"
#: The SMTP connection the e-mails go through; empty: the SMTP provider's default.
SMTP_CONN_ENV = "EMBEDFRESH_NOTIFY_SMTP_CONN_ID"
#: The sender; empty: Airflow's ``[email] from_email``, else the connection's extra.
FROM_ENV = "EMBEDFRESH_NOTIFY_FROM"
#: The HTTP connection of a Slack-compatible webhook; empty: no webhook.
WEBHOOK_CONN_ENV = "EMBEDFRESH_NOTIFY_WEBHOOK_CONN_ID"
#: ``false``: the webhook gets ``{"text": ...}`` only, no Slack blocks.
WEBHOOK_BLOCKS_ENV = "EMBEDFRESH_NOTIFY_WEBHOOK_BLOCKS"
SETTINGS_ENVS = (EMAIL_ENV, SMTP_CONN_ENV, FROM_ENV, WEBHOOK_CONN_ENV, WEBHOOK_BLOCKS_ENV)

#: The SMTP provider's default connection (``SmtpHook.default_conn_name``), for the docs:
#: an unset :data:`SMTP_CONN_ENV` lets the provider choose, which honours
#: ``[email] email_conn_id`` first.
DEFAULT_SMTP_CONN_ID = "smtp_default"
#: Seconds a webhook POST may take (connect and read) before it counts as failed.
WEBHOOK_TIMEOUT_S = 30

#: The web UI's address when ``[api] base_url`` is unset (Airflow's own log links use it).
DEFAULT_BASE_URL = "http://localhost:8080/"
#: Subject prefix of every message.
SUBJECT_PREFIX = "[embedfresh]"

GATE = "gate"
RUN_FAILED = "run_failed"
PROMOTE_ANYWAY = "promote_anyway"
ROLLBACK = "rollback"
STALE = "stale"
#: The events a DAG can ask notifiers for.
EVENTS = (GATE, RUN_FAILED, PROMOTE_ANYWAY, ROLLBACK, STALE)
#: The deadline breach's event name (sent by :func:`notify_deadline_breach`).
DEADLINE_MISSED = "deadline_missed"

# The same address shape the SMTP provider splits a recipient list into: a bare
# addr-spec, no display name (a name with a comma would be split by the provider).
_ADDRESS = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
# Airflow's own rule for a connection id (airflow.models.connection.RE_SANITIZE_CONN_ID).
_CONN_ID = re.compile(r"^[\w#!()\-.:/\\]{1,250}$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


# -- settings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NotifySettings:
    """The deployment's notification settings (:func:`notify_settings`)."""

    email_to: tuple[str, ...] = ()
    smtp_conn_id: str | None = None
    from_email: str | None = None
    webhook_conn_id: str | None = None
    webhook_blocks: bool = True

    @property
    def configured(self) -> bool:
        return bool(self.email_to or self.webhook_conn_id)


def notify_settings(environ: Mapping[str, str] | None = None) -> NotifySettings:
    """Read and check the settings (default: ``os.environ``, at call time).

    :raises ValueError: a setting is invalid; the message names the variable.
    """
    env = os.environ if environ is None else environ

    def get(name: str) -> str:
        return (env.get(name) or "").strip()

    to = _addresses(get(EMAIL_ENV), EMAIL_ENV)
    smtp_conn_id = _conn_id(get(SMTP_CONN_ENV), SMTP_CONN_ENV)
    from_email = get(FROM_ENV) or None
    if from_email is not None and not _ADDRESS.match(from_email):
        raise ValueError(f"{FROM_ENV} must be one e-mail address, got {from_email!r}")
    if not to and (smtp_conn_id or from_email):
        named = SMTP_CONN_ENV if smtp_conn_id else FROM_ENV
        raise ValueError(
            f"{named} is set but {EMAIL_ENV} names no recipient: set {EMAIL_ENV} "
            f"(comma-separated addresses) or unset {named}"
        )
    blocks_raw = get(WEBHOOK_BLOCKS_ENV).lower()
    if blocks_raw and blocks_raw not in _TRUE | _FALSE:
        raise ValueError(f"{WEBHOOK_BLOCKS_ENV} must be true or false, got {blocks_raw!r}")
    return NotifySettings(
        email_to=to,
        smtp_conn_id=smtp_conn_id,
        from_email=from_email,
        webhook_conn_id=_conn_id(get(WEBHOOK_CONN_ENV), WEBHOOK_CONN_ENV),
        webhook_blocks=blocks_raw not in _FALSE,
    )


def _addresses(raw: str, name: str) -> tuple[str, ...]:
    if not raw:
        return ()
    found = tuple(a.strip() for a in re.split(r"[,;]", raw) if a.strip())
    if not found:
        raise ValueError(f"{name} names no e-mail address: {raw!r}")
    for address in found:
        if not _ADDRESS.match(address):
            raise ValueError(
                f"{name} holds an invalid e-mail address {address!r} (expected "
                f"comma-separated addresses like ml-team@example.com)"
            )
    return found


def _conn_id(raw: str, name: str) -> str | None:
    if not raw:
        return None
    if not _CONN_ID.match(raw):
        raise ValueError(f"{name} is not a valid Airflow connection id: {raw!r}")
    return raw


def notifiers(event: str, environ: Mapping[str, str] | None = None) -> list[BaseNotifier]:
    """The configured notifiers of ``event``, one per channel; ``[]`` when none is set.

    Give the list to a callback argument: ``on_failure_callback=notifiers("run_failed")``.
    Each notifier is called with the callback's context and builds its message then.

    :param event: one of :data:`EVENTS`.
    :param environ: the settings' source (default ``os.environ``).
    :raises ValueError: an unknown event, or an invalid setting (named).
    """
    if event not in EVENTS:
        raise ValueError(f"unknown notification event {event!r}; known: {', '.join(EVENTS)}")
    return _channels(event, notify_settings(environ))


def _channels(event: str, settings: NotifySettings) -> list[EmbedfreshNotifier]:
    found: list[EmbedfreshNotifier] = []
    if settings.email_to:
        found.append(
            EmailNotifier(
                event,
                to=settings.email_to,
                smtp_conn_id=settings.smtp_conn_id,
                from_email=settings.from_email,
            )
        )
    if settings.webhook_conn_id:
        found.append(
            WebhookNotifier(
                event, http_conn_id=settings.webhook_conn_id, blocks=settings.webhook_blocks
            )
        )
    return found


def _check_event(event: str) -> str:
    if event not in (*EVENTS, DEADLINE_MISSED):
        raise ValueError(f"unknown notification event {event!r}; known: {', '.join(EVENTS)}")
    return event


# -- messages -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One notification: a subject, a plain-text body, and labelled links."""

    event: str
    subject: str
    body: str
    links: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        """The whole message as plain text: the body, then one ``label: URL`` line a link."""
        lines = [f"{label}: {url}" for label, url in self.links]
        return self.body + ("\n\n" + "\n".join(lines) if lines else "") + "\n"

    def html(self) -> str:
        """The plain text as HTML (the SMTP provider sends HTML): escaped, line breaks
        kept, URLs clickable."""
        escaped = html.escape(self.text(), quote=False)
        linked = re.sub(
            r"https?://[^\s<>\"]+",
            lambda m: f'<a href="{m.group(0).replace(chr(34), "&quot;")}">{m.group(0)}</a>',
            escaped,
        )
        return f'<pre style="font-family: sans-serif; white-space: pre-wrap">{linked}</pre>'

    def slack_payload(self, blocks: bool = True) -> dict[str, Any]:
        """Slack-compatible JSON: ``text`` (the whole message; what a receiver without
        blocks shows and Slack's notification text), and Slack blocks unless ``blocks`` is
        false: a header with the subject, the body, the links."""
        payload: dict[str, Any] = {"text": _mrkdwn(f"{self.subject}\n\n{self.text()}")}
        if not blocks:
            return payload
        parts: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": _cut(self.subject, 150)}}
        ]
        for chunk in _chunks(_mrkdwn(self.body), 3000):
            parts.append({"type": "section", "text": {"type": "mrkdwn", "text": chunk}})
        if self.links:
            parts.append(
                {
                    "type": "context",
                    "elements": [
                        {"type": "mrkdwn", "text": f"<{url}|{_mrkdwn(label)}>"}
                        for label, url in self.links[:10]  # Slack allows 10 elements
                    ],
                }
            )
        payload["blocks"] = parts
        return payload


def _mrkdwn(text: str) -> str:
    """Slack's three control characters, escaped as its docs ask."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _chunks(text: str, limit: int) -> list[str]:
    chunks: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        while len(line) > limit:
            if current:
                chunks.append(current)
                current = ""
            chunks.append(line[:limit])
            line = line[limit:]
        if len(current) + len(line) > limit:
            chunks.append(current)
            current = ""
        current += line
    if current.strip():
        chunks.append(current)
    return [c.rstrip("\n") for c in chunks if c.strip()] or [" "]


def airflow_base_url() -> str:
    """The web UI's address: Airflow's ``[api] base_url``, else :data:`DEFAULT_BASE_URL`."""
    from airflow.sdk.configuration import conf

    try:
        base = conf.get("api", "base_url", fallback=None)
    except Exception:  # a broken config must not cost the notification
        log.warning("could not read [api] base_url; using %s", DEFAULT_BASE_URL, exc_info=True)
        base = None
    return (base or DEFAULT_BASE_URL).rstrip("/")


def model_quality_url(model: str, base_url: str | None = None) -> str:
    """The Model quality page of ``model`` (the task's extra link's), on
    :func:`airflow_base_url` unless ``base_url`` is given."""
    return links.model_quality_url(model, base_url or airflow_base_url())


def run_url(dag_id: str, run_id: str, base_url: str | None = None) -> str:
    """A DAG run's page in the web UI."""
    base = (base_url or airflow_base_url()).rstrip("/")
    return f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _pct(value: Any, signed: bool = True) -> str:
    """A relative difference (0.0041) in percent (+0.410%); ``n/a`` when not a number."""
    number = _num(value)
    if number is None:
        return "n/a"
    return f"{number * 100:+.3f}%" if signed else f"{number * 100:.3g}%"


def _value(value: Any) -> str:
    number = _num(value)
    return "n/a" if number is None else f"{number:.4f}"


def _metric_line(metric: Mapping[str, Any]) -> str:
    confidence = _num(metric.get("confidence"))
    level = f"{confidence * 100:g}% " if confidence is not None else ""
    line = (
        f"- {metric.get('metric', '?')}: {metric.get('verdict', '?')}, "
        f"d {_pct(metric.get('d'))}, {level}interval "
        f"[{_pct(metric.get('ci_low'))}, {_pct(metric.get('ci_high'))}]"
    )
    details = []
    if metric.get("n") is not None:
        details.append(f"n {metric['n']}")
    if metric.get("m_cand") is not None or metric.get("m_ref") is not None:
        details.append(
            f"candidate {_value(metric.get('m_cand'))}, reference {_value(metric.get('m_ref'))}"
        )
    if metric.get("n_needed"):
        details.append(f"about {metric['n_needed']} examples would decide")
    return line + (f" ({'; '.join(details)})" if details else "")


_VERDICT_MEANS = {
    ("FAIL", "no_regression"): "the candidate is worse than the reference by more than the "
    "tolerance, at the stated confidence.",
    ("FAIL", "parity"): "the two sides differ by more than the tolerance, at the stated "
    "confidence: parity is not shown.",
    ("INCONCLUSIVE", None): "the interval is too wide to decide either way. Evaluate on a "
    "larger held-out set rather than guess.",
}


def gate_message(
    summary: Mapping[str, Any],
    *,
    dag_id: str | None = None,
    log_url: str | None = None,
    base_url: str | None = None,
) -> Message | None:
    """The message for a gate's decision; None for PASS (nothing to tell).

    :param summary: the gate task's XCom: ``verdict``, ``mode``, ``reason``,
        ``candidate``, ``reference``, ``report``, ``model``, ``run_id`` and ``metrics``
        (each ``metric``, ``verdict``, ``d``, ``ci_low``, ``ci_high``, ``confidence``,
        ``n``, ``m_cand``, ``m_ref``); missing keys show as ``?``/``n/a``.
    :param dag_id: the DAG of the run, for the run's link.
    :param log_url: the gate task's log.
    :param base_url: the web UI's address (default :func:`airflow_base_url`).
    """
    verdict = str(summary.get("verdict") or "UNKNOWN").upper()
    if verdict == "PASS":
        return None
    mode = str(summary.get("mode") or "no_regression")
    model = str(summary.get("model") or "?")
    candidate = summary.get("candidate") or "?"
    reference = summary.get("reference") or "?"
    run_id = summary.get("run_id")
    base = base_url or airflow_base_url()

    tolerance = _num(summary.get("tolerance"))
    head = f"Model {model}: the quality gate decided {verdict} (mode {mode}"
    head += f", tolerance {_pct(tolerance, signed=False)})." if tolerance is not None else ")."
    if mode == "parity":
        outcome = f"Candidate {candidate} vs reference {reference}: parity is not shown."
    else:
        outcome = f"Candidate {candidate} is not released; production stays at {reference}."
    lines = [head, outcome, "", f"Reason: {summary.get('reason') or 'none given'}"]
    means = _VERDICT_MEANS.get((verdict, mode)) or _VERDICT_MEANS.get((verdict, None))
    if means:
        lines.append(f"{verdict} means: {means}")
    if summary.get("n_needed"):
        lines.append(f"An evaluation set of about {summary['n_needed']} examples would decide.")
    metrics = [m for m in summary.get("metrics") or [] if isinstance(m, Mapping)]
    if metrics:
        lines += ["", "Metrics (d = (candidate - reference) / reference, in percent):"]
        lines += [_metric_line(m) for m in metrics]
    if mode != "parity" and candidate != "?":
        lines += [
            "",
            f"To release it anyway, a person triggers embedfresh_promote_anyway with "
            f"version={candidate} and a reason.",
        ]

    links = [("Model quality page", model_quality_url(model, base))]
    if summary.get("report"):
        links.append(("Gate report", str(summary["report"])))
    if dag_id and run_id:
        links.append(("Run", run_url(dag_id, str(run_id), base)))
    if log_url:
        links.append(("Gate task log", log_url))
    subject = f"{SUBJECT_PREFIX} Gate {verdict}: {model} candidate {candidate} not released"
    if mode == "parity":
        subject = f"{SUBJECT_PREFIX} Gate {verdict}: {model} parity not shown ({candidate} vs {reference})"
    return Message(GATE, subject, "\n".join(lines), tuple(links))


def run_failed_message(
    *,
    dag_id: str,
    run_id: str,
    failed_tasks: Sequence[str] = (),
    upstream_failed: int = 0,
    reason: str | None = None,
    error: str | None = None,
    log_url: str | None = None,
    model: str | None = None,
    base_url: str | None = None,
) -> Message:
    """The message for a failed run (or a failed task)."""
    base = base_url or airflow_base_url()
    tasks = ", ".join(failed_tasks) if failed_tasks else "unknown"
    lines = [f"Run {run_id} of DAG {dag_id} failed.", f"Failed tasks: {tasks}"]
    if upstream_failed:
        lines.append(f"Tasks not run because of them: {upstream_failed}")
    if reason:
        lines.append(f"Airflow's reason: {reason}")
    if error:
        lines.append(f"Error: {_cut(error, 1500)}")
    links = [("Run", run_url(dag_id, run_id, base))]
    if log_url:
        links.append(("Task log", log_url))
    if model:
        links.append(("Model quality page", model_quality_url(model, base)))
    shown = f" ({', '.join(failed_tasks[:3])}{', ...' if len(failed_tasks) > 3 else ''})"
    subject = f"{SUBJECT_PREFIX} Run failed: {dag_id} {run_id}" + (shown if failed_tasks else "")
    return Message(RUN_FAILED, subject, "\n".join(lines), tuple(links))


def stale_message(facts: Mapping[str, Any], base_url: str | None = None) -> Message | None:
    """The message for a stale production (:func:`embedfresh.core.freshness.freshness`'s
    facts); None when it is fresh."""
    if not facts.get("stale"):
        return None
    model = str(facts.get("model") or "?")
    age, limit = facts.get("age_days"), facts.get("stale_after_days")
    lines = [
        f"Model {model}: production ({facts.get('production')}, release "
        f"{facts.get('release')}) trained on data through {facts.get('trained_through')}, "
        f"{age} days before the newest data ({facts.get('newest_data')}); the limit is "
        f"{limit} days. No refresh has released since.",
        "",
        "What held it:",
    ]
    for run in facts.get("held_by") or []:
        checks = "; ".join(
            f"search check {c}: {v[0]} ({_cut(str(v[1]), 300)})"
            for c, v in (run.get("search_checks") or {}).items()
        )
        lines.append(
            f"- run {run.get('run_id')}: gate {run.get('gate')} on {run.get('n_queries')} "
            f"queries ({_cut(str(run.get('reason')), 400)})" + (f"; {checks}" if checks else "")
        )
    if not facts.get("held_by"):
        lines.append("- no refresh decided since the live release (none ran, or all failed)")
    base = base_url or airflow_base_url()
    return Message(
        event=STALE,
        subject=f"[embedfresh] STALE: {model} production is {age} days old",
        body="\n".join(lines),
        links=(("Model quality page", model_quality_url(model, base)),),
    )


def override_message(
    action: str,
    *,
    model: str,
    who: str | None,
    reason: str | None,
    version: str | None = None,
    release: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
    failed: bool = False,
    error: str | None = None,
    base_url: str | None = None,
) -> Message:
    """The message for a person's override: ``promote_anyway`` or ``rollback``."""
    if action not in (PROMOTE_ANYWAY, ROLLBACK):
        raise ValueError(f"unknown override {action!r}: {PROMOTE_ANYWAY} or {ROLLBACK}")
    base = base_url or airflow_base_url()
    who = who or "an unknown user"
    what = (
        f"version {version or '?'}" + (f" (release {release})" if release else "")
        if action == PROMOTE_ANYWAY
        else f"release {release or '?'}" + (f" (version {version})" if version else "")
    )
    if action == PROMOTE_ANYWAY:
        name = "Promote anyway"
        done = f"{who} released model {model} {what} although no quality gate passed it."
        subject_end = f"{model} {what} is live, by {who}"
    else:
        name = "Rollback"
        done = f"{who} made {what} of model {model} live again."
        subject_end = f"{model} {what} is live again, by {who}"
    if failed:
        done = f"{who}'s {name.lower()} of model {model} ({what}) FAILED: the live release stays as it was."
        subject_end = f"{model} {what} by {who} failed"
    lines = [done, f"Reason given: {reason or 'none given'}"]
    if error:
        lines.append(f"Error: {_cut(error, 1500)}")
    if not failed:
        lines.append("The registry's history records who and why.")
    links = [("Model quality page", model_quality_url(model, base))]
    if dag_id and run_id:
        links.append(("Run", run_url(dag_id, run_id, base)))
    subject = f"{SUBJECT_PREFIX} {name}: {subject_end}"
    return Message(action, subject, "\n".join(lines), tuple(links))


def deadline_message(
    *,
    model: str,
    run_id: str,
    dag_id: str | None,
    deadline_time: dt.datetime | str | None = None,
    interval_seconds: float | None = None,
    late_seconds: float | None = None,
    state: str | None = None,
    queued_at: dt.datetime | str | None = None,
    record_url: str | None = None,
    base_url: str | None = None,
) -> Message:
    """The message for a run that had not finished by its deadline."""
    base = base_url or airflow_base_url()
    dag = dag_id or "?"
    if late_seconds is None:
        when = _when(deadline_time)
        if when is not None:
            late_seconds = (dt.datetime.now(dt.UTC) - when).total_seconds()
    lines = [
        f"Run {run_id} of DAG {dag} (model {model}) had not finished by its deadline "
        f"{_text(deadline_time) or '?'}."
    ]
    if interval_seconds is not None:
        lines.append(
            f"Its time budget: {_duration(interval_seconds)} from being queued"
            + (f" at {_text(queued_at)}." if queued_at else ".")
        )
    if late_seconds is not None:
        lines.append(f"Late by {_duration(max(late_seconds, 0.0))} when this was sent.")
    if state:
        lines.append(f"Its state at the deadline: {state}.")
    lines.append(
        "Airflow does not stop a run at its deadline: it goes on, and whatever waits for "
        "its model or embeddings waits too."
    )
    links = [("Run", run_url(dag, run_id, base))] if dag_id else []
    if record_url:
        links.append(("Breach record", record_url))
    links.append(("Model quality page", model_quality_url(model, base)))
    late = f", {_duration(late_seconds)} late" if late_seconds is not None else ""
    subject = f"{SUBJECT_PREFIX} Deadline missed: {dag} run {run_id} ({model}){late}"
    return Message(DEADLINE_MISSED, subject, "\n".join(lines), tuple(links))


def _when(value: dt.datetime | str | None) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str) and value:
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# -- from an Airflow callback context to a message ------------------------------------


def build_message(event: str, context: Mapping[str, Any]) -> Message | None:
    """The message of ``event`` for an Airflow callback ``context``; None: nothing to tell."""
    _check_event(event)
    if event == GATE:
        summary = _own_return_value(context)
        if not isinstance(summary, Mapping):
            log.warning(
                "gate notification: no decision in the task's return_value XCom (%r): "
                "nothing sent (a gate that failed before deciding is a failed run)",
                type(summary).__name__,
            )
            return None
        return gate_message(summary, dag_id=_dag_id(context), log_url=_log_url(context))
    if event == RUN_FAILED:
        dag_id, run_id = _dag_id(context) or "?", _run_id(context) or "?"
        failed, upstream = _failed_tasks(context, dag_id, run_id)
        error = context.get("exception")
        return run_failed_message(
            dag_id=dag_id,
            run_id=run_id,
            failed_tasks=failed,
            upstream_failed=upstream,
            reason=context.get("reason"),
            error=str(error) if error else None,
            log_url=_log_url(context),
            model=_param(context, "model"),
        )
    if event == STALE:
        summary = _own_return_value(context)
        return stale_message(summary) if isinstance(summary, Mapping) else None
    if event in (PROMOTE_ANYWAY, ROLLBACK):
        task = context.get("task")
        summary = _own_return_value(context)
        summary = summary if isinstance(summary, Mapping) else {}
        dag_run = context.get("dag_run")
        who = _attr(task, "who") or _field(dag_run, "triggering_user_name")
        error = context.get("exception")
        return override_message(
            event,
            model=str(_attr(task, "model") or _param(context, "model") or "?"),
            who=who,
            reason=_attr(task, "reason") or _param(context, "reason"),
            version=summary.get("production")
            or _attr(task, "version")
            or _param(context, "version"),
            release=summary.get("release") or _attr(task, "release") or _param(context, "release"),
            dag_id=_dag_id(context),
            run_id=_run_id(context),
            failed=_failed(context),
            error=str(error) if error else None,
        )
    return None  # DEADLINE_MISSED has no callback context: notify_deadline_breach


def _field(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _attr(task: Any, name: str) -> str | None:
    value = getattr(task, name, None) if task is not None else None
    return value if isinstance(value, str) and value and "{{" not in value else None


def _param(context: Mapping[str, Any], name: str) -> str | None:
    for source in (context.get("params"), _field(context.get("dag_run"), "conf")):
        value = _field(source, name) if source is not None else None
        if value not in (None, ""):
            return str(value)
    return None


def _dag_id(context: Mapping[str, Any]) -> str | None:
    return (
        _field(context.get("dag"), "dag_id")
        or _field(context.get("dag_run"), "dag_id")
        or _field(context.get("ti"), "dag_id")
    )


def _run_id(context: Mapping[str, Any]) -> str | None:
    return (
        context.get("run_id")
        or _field(context.get("dag_run"), "run_id")
        or _field(context.get("ti"), "run_id")
    )


def _log_url(context: Mapping[str, Any]) -> str | None:
    ti = context.get("ti")
    try:
        url = getattr(ti, "log_url", None) if ti is not None else None
    except Exception:  # it reads the config; a context without a full ti has none
        return None
    return url if isinstance(url, str) and url else None


def _failed(context: Mapping[str, Any]) -> bool:
    if context.get("exception") is not None:
        return True
    reason = str(context.get("reason") or "").lower()
    return _state(_field(context.get("ti"), "state")) == "failed" or "fail" in reason


def _state(value: Any) -> str:
    """A task state as its plain name (``failed``), whether an enum or a string."""
    return str(getattr(value, "value", value) or "").lower()


def _own_return_value(context: Mapping[str, Any]) -> Any:
    """The ``return_value`` XCom of the task the callback is about (pushed before
    ``on_success_callback`` runs in Airflow 3.3's task runner)."""
    ti = context.get("ti")
    if ti is None:
        return None
    map_index = getattr(ti, "map_index", None)
    try:
        return ti.xcom_pull(task_ids=ti.task_id, map_indexes=-1 if map_index is None else map_index)
    except Exception:
        log.warning("could not read the return_value XCom of %s", ti.task_id, exc_info=True)
        return None


def _failed_tasks(context: Mapping[str, Any], dag_id: str, run_id: str) -> tuple[list[str], int]:
    """The run's failed task ids (mapped ones as ``task_map-index``) and how many tasks
    did not run because of them, asked of Airflow (``get_task_states``: the task runner
    and the dag-processor answer it); else the failed task the context is about (the
    only answer under ``dag.test()``, whose DAG callbacks run without supervisor comms)."""
    try:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        states = RuntimeTaskInstance.get_task_states(dag_id=dag_id, run_ids=[run_id])
        run_states = {t: _state(s) for t, s in (states.get(run_id) or {}).items()}
        failed = sorted(t for t, s in run_states.items() if s == "failed")
        upstream = sum(1 for s in run_states.values() if s == "upstream_failed")
        if failed:
            return failed, upstream
    except Exception:
        log.debug("could not ask Airflow for the run's task states", exc_info=True)
    ti = context.get("ti")
    task_id = _field(ti, "task_id")
    state = _state(_field(ti, "state"))
    if task_id and (state in ("", "failed") or context.get("exception") is not None):
        return [str(task_id)], 0
    return [], 0


# -- the notifiers ------------------------------------------------------------------------


class EmbedfreshNotifier(BaseNotifier, abc.ABC):
    """A notifier of one event (:data:`EVENTS`) on one channel: builds the message from
    the callback's context, sends nothing when there is nothing to tell (a gate PASS).
    A channel implements :meth:`send` with a provider's notifier built for the message
    (imported then: the HTTP one costs a DAG file 0.2 s of imports).

    None of our text is rendered as Jinja: the messages carry people's text (a reason);
    only a sender the SMTP provider reads from its connection is (admin data). Only the
    synchronous path is offered (``async_notify`` is the base class's refusal)."""

    channel = "none"

    def __init__(self, event: str) -> None:
        super().__init__()
        self.event = _check_event(event)

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Nothing to render (see the class). Skipping it also spares a DAG callback under
        ``dag.test()``, whose context holds a ``SerializedDAG`` without
        ``get_template_env`` (Airflow 3.3.2)."""

    def notify(self, context: Any) -> None:
        message = build_message(self.event, context)
        if message is None:
            self.log.info("%s notification: nothing to tell, nothing sent", self.event)
            return
        self.send(message)
        self.log.info("%s notification sent by %s: %s", self.event, self.channel, message.subject)

    @abc.abstractmethod
    def send(self, message: Message) -> None:
        """Send ``message`` with the provider's notifier's ``notify``, given no callback
        context (so it renders nothing with the context's DAG). Raises when the channel
        refuses the message."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.event!r})"


class EmailNotifier(EmbedfreshNotifier):
    """E-mail sent by the SMTP provider's ``SmtpNotifier``: the subject and the HTML body
    are the message's.

    :param to: recipients.
    :param smtp_conn_id: the SMTP connection; None: the provider's default
        (``[email] email_conn_id``, else ``smtp_default``).
    :param from_email: sender; None: ``[email] from_email``, else the connection's
        ``from_email`` extra.
    """

    channel = "e-mail"

    def __init__(
        self,
        event: str,
        *,
        to: Sequence[str],
        smtp_conn_id: str | None = None,
        from_email: str | None = None,
    ) -> None:
        super().__init__(event)
        self.to = list(to)
        self.smtp_conn_id = smtp_conn_id
        self.from_email = from_email

    def send(self, message: Message) -> None:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier
        from airflow.sdk.configuration import conf

        SmtpNotifier(
            to=self.to,
            smtp_conn_id=self.smtp_conn_id,
            from_email=self.from_email or conf.get("email", "from_email", fallback=None) or None,
            subject=message.subject,
            html_content=message.html(),
        ).notify({})


class WebhookNotifier(EmbedfreshNotifier):
    """Slack-compatible JSON posted by the HTTP provider's ``HttpNotifier``.

    :param http_conn_id: an ``http`` connection whose host is the webhook's whole URL.
    :param blocks: also send Slack blocks (header, body, links) beside ``text``.
    """

    channel = "webhook"

    def __init__(self, event: str, *, http_conn_id: str, blocks: bool = True) -> None:
        super().__init__(event)
        self.http_conn_id = http_conn_id
        self.blocks = blocks

    def send(self, message: Message) -> None:
        from airflow.providers.http.notifications.http import HttpNotifier

        HttpNotifier(
            http_conn_id=self.http_conn_id,
            json=message.slack_payload(blocks=self.blocks),
            extra_options={"timeout": WEBHOOK_TIMEOUT_S},
        ).notify({})


# -- outside a callback: the deadline breach ---------------------------------------------


def deliver(message: Message, environ: Mapping[str, str] | None = None) -> int:
    """Send ``message`` on every configured channel; returns how many took it.

    A channel that fails is logged and does not stop the others, and an invalid setting
    is logged: this runs inside other callbacks (the deadline's record), which must not
    fail because a notification did.
    """
    try:
        channels = _channels(message.event, notify_settings(environ))
    except ValueError:
        log.exception("notification settings are invalid: %s not sent", message.subject)
        return 0
    sent = 0
    for channel in channels:
        try:
            channel.send(message)
        except Exception:
            log.exception("%r could not send %s", channel, message.subject)
        else:
            sent += 1
    return sent


def notify_deadline_breach(**breach: Any) -> int:
    """Tell people a run missed its deadline (:func:`deadline_message`), on every
    configured channel; for :func:`embedfresh.operators.deadline.record_deadline_breach`.

    :param breach: :func:`deadline_message`'s arguments.
    :return: how many channels took the message (0 when none is configured). Never
        raises on a failed send (logged).
    """
    return deliver(deadline_message(**breach))
