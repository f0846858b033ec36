"""People are told: the notifiers of embedfresh.operators.notify against real servers.

An SMTP server (aiosmtpd) and an HTTP server (the standard library's) run on 127.0.0.1 in
the test; Airflow connections (``AIRFLOW_CONN_*``) point the providers' hooks at them, and
each test reads what the server received. The callback contexts are built here with the
fields Airflow 3.3 gives a callback (``ti`` with ``xcom_pull``, ``dag``, ``run_id``,
``reason``, ``dag_run``, ``task``, ``params``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from embedfresh.operators import notify
from embedfresh.operators.notify import (
    EMAIL_ENV,
    FROM_ENV,
    SETTINGS_ENVS,
    SMTP_CONN_ENV,
    WEBHOOK_BLOCKS_ENV,
    WEBHOOK_CONN_ENV,
    build_message,
    notifiers,
    notify_deadline_breach,
)
from tests.mailbox import RECIPIENTS, SENDER, Mailbox

BASE_URL = "https://airflow.example.com/"
PAGE = "https://airflow.example.com/model-quality/?model=tiny"
_ids = itertools.count()

FAIL_SUMMARY: dict[str, Any] = {
    "verdict": "FAIL",
    "mode": "no_regression",
    "reason": "accuracy fell below the reference by more than the 0.1% tolerance",
    "candidate": "2026-01-02",
    "reference": "2026-01-01",
    "report": "file:///store/runs/tiny/r2/reports/gate.json",
    "model": "tiny",
    "run_id": "r2",
    "tolerance": 0.001,
    "metrics": [
        {
            "metric": "accuracy",
            "verdict": "FAIL",
            "d": -0.0041,
            "ci_low": -0.0063,
            "ci_high": -0.0019,
            "confidence": 0.95,
            "n": 768,
            "m_cand": 0.8112,
            "m_ref": 0.8145,
        },
        {
            "metric": "auc",
            "verdict": "PASS",
            "d": 0.00021,
            "ci_low": -0.0005,
            "ci_high": 0.0009,
            "confidence": 0.95,
            "n": 768,
            "m_cand": 0.9021,
            "m_ref": 0.9019,
        },
    ],
}
# Each metric's line: its d and its interval in percent.
FAIL_LINES = [
    "- accuracy: FAIL, d -0.410%, 95% interval [-0.630%, -0.190%]",
    "- auc: PASS, d +0.021%, 95% interval [-0.050%, +0.090%]",
]


@dataclass
class FakeTI:
    """What a callback's ``context["ti"]`` offers the notifiers: its ids, its log URL and
    ``xcom_pull``, answering only for its own task and map index (as Airflow does)."""

    task_id: str = "gate"
    dag_id: str = "embedding_model_refresh"
    run_id: str = "r2"
    map_index: int = -1
    state: str = "success"
    log_url: str = "https://airflow.example.com/dags/embedding_model_refresh/runs/r2/tasks/gate"
    xcom: dict[tuple[str, int], Any] = field(default_factory=dict)

    def xcom_pull(self, task_ids=None, map_indexes=None, key="return_value", **_: Any) -> Any:
        assert key == "return_value"
        return self.xcom.get((task_ids, map_indexes))


def gate_context(summary: dict[str, Any]) -> dict[str, Any]:
    ti = FakeTI(xcom={("gate", -1): summary})
    return {
        "ti": ti,
        "dag": SimpleNamespace(dag_id=ti.dag_id),
        "run_id": ti.run_id,
        "params": {"model": "tiny"},
    }


# -- servers -----------------------------------------------------------------------------


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No notification setting from the caller's environment; a known web UI address."""
    for name in SETTINGS_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE_URL)
    return monkeypatch


@pytest.fixture
def smtp(env: pytest.MonkeyPatch) -> Iterator[Mailbox]:
    """A real SMTP server on 127.0.0.1, the connection to it, and e-mail turned on."""
    with Mailbox() as inbox:
        for name, value in inbox.env(f"notify_smtp_{next(_ids)}").items():
            env.setenv(name, value)
        yield inbox


@dataclass
class _Hook:
    path: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200


@pytest.fixture
def webhook(env: pytest.MonkeyPatch) -> Iterator[_Hook]:
    """A local HTTP server taking webhook POSTs, its connection, and the webhook turned on."""
    hook = _Hook(path=f"/services/T000/B000/secret{next(_ids)}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hook.requests.append(
                {
                    "path": self.path,
                    "content_type": self.headers.get("Content-Type"),
                    "body": json.loads(body),
                }
            )
            self.send_response(hook.status)
            self.end_headers()
            self.wfile.write(b"ok" if hook.status == 200 else b"invalid_payload")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conn_id = f"notify_hook_{next(_ids)}"
    url = f"http://127.0.0.1:{server.server_port}{hook.path}"
    env.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "http", "host": url}))
    env.setenv(WEBHOOK_CONN_ENV, conn_id)
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _only(found: list, kind: type) -> Any:
    (one,) = [n for n in found if isinstance(n, kind)]
    return one


# -- settings ------------------------------------------------------------------------------


def test_nothing_configured_means_no_notifiers_and_nothing_sent(env):
    for event in notify.EVENTS:
        assert notifiers(event) == []
    assert notify_deadline_breach(model="tiny", run_id="r", dag_id="d", late_seconds=5) == 0


@pytest.mark.parametrize(
    "settings, named",
    [
        ({EMAIL_ENV: "ml-team@example.com, not-an-address"}, EMAIL_ENV),
        ({EMAIL_ENV: "ml team@example.com"}, EMAIL_ENV),
        ({EMAIL_ENV: " , "}, EMAIL_ENV),
        ({SMTP_CONN_ENV: "smtp_default"}, SMTP_CONN_ENV),  # a server but nobody to tell
        ({EMAIL_ENV: "ml-team@example.com", FROM_ENV: "airflow"}, FROM_ENV),
        ({WEBHOOK_CONN_ENV: "slack hook"}, WEBHOOK_CONN_ENV),
        ({WEBHOOK_CONN_ENV: "slack", WEBHOOK_BLOCKS_ENV: "maybe"}, WEBHOOK_BLOCKS_ENV),
    ],
)
def test_an_invalid_setting_fails_at_parse_time_naming_the_variable(env, settings, named):
    for name, value in settings.items():
        env.setenv(name, value)
    with pytest.raises(ValueError, match=named):
        notifiers("run_failed")


def test_an_unknown_event_is_refused(env):
    with pytest.raises(ValueError, match="gate_failed"):
        notifiers("gate_failed")


def test_the_page_link_is_the_task_links_own():
    assert notify.model_quality_url("minilm", "https://af.example/") == (
        "https://af.example/model-quality/?model=minilm"
    )


# -- the gate --------------------------------------------------------------------------------


def test_a_gate_fail_email_reaches_the_smtp_server(smtp):
    mail = _only(notifiers("gate"), notify.EmailNotifier)

    mail(gate_context(FAIL_SUMMARY))  # as Airflow calls an on_success_callback

    (envelope,) = smtp.envelopes
    assert envelope.mail_from == SENDER
    assert envelope.rcpt_tos == list(RECIPIENTS)
    (message,) = smtp.messages()
    assert message["Subject"] == "[embedfresh] Gate FAIL: tiny candidate 2026-01-02 not released"
    body = message.get_body(preferencelist=("html",)).get_content()
    for line in FAIL_LINES:
        assert line in body
    assert FAIL_SUMMARY["reason"] in body
    assert f'<a href="{PAGE}">{PAGE}</a>' in body
    assert FAIL_SUMMARY["report"] in body


def test_a_gate_pass_sends_nothing_where_a_fail_is_sent(smtp, webhook):
    found = notifiers("gate")
    assert {type(n) for n in found} == {notify.EmailNotifier, notify.WebhookNotifier}

    for notifier in found:
        notifier(gate_context({**FAIL_SUMMARY, "verdict": "PASS", "reason": "all metrics pass"}))
    assert smtp.envelopes == [] and webhook.requests == []

    for notifier in found:  # the same notifiers and servers do carry a FAIL
        notifier(gate_context(FAIL_SUMMARY))
    assert len(smtp.envelopes) == 1 and len(webhook.requests) == 1


def test_the_webhook_gets_slack_compatible_json(webhook):
    hook = _only(notifiers("gate"), notify.WebhookNotifier)

    hook(gate_context(FAIL_SUMMARY))

    (request,) = webhook.requests
    assert request["path"] == webhook.path
    assert request["content_type"] == "application/json"
    body = request["body"]
    subject = "[embedfresh] Gate FAIL: tiny candidate 2026-01-02 not released"
    assert body["text"].startswith(subject + "\n")
    for line in FAIL_LINES:
        assert line in body["text"]
    assert PAGE in body["text"]
    header, *sections, links = body["blocks"]
    assert header == {"type": "header", "text": {"type": "plain_text", "text": subject}}
    assert all(s["type"] == "section" and s["text"]["type"] == "mrkdwn" for s in sections)
    assert FAIL_LINES[0] in "\n".join(s["text"]["text"] for s in sections)
    assert {"type": "mrkdwn", "text": f"<{PAGE}|Model quality page>"} in links["elements"]


def test_the_webhook_can_post_text_only(webhook, env):
    env.setenv(WEBHOOK_BLOCKS_ENV, "false")
    _only(notifiers("gate"), notify.WebhookNotifier)(gate_context(FAIL_SUMMARY))
    (request,) = webhook.requests
    assert set(request["body"]) == {"text"}


def test_an_inconclusive_gate_says_so_and_asks_for_more_data(webhook):
    summary = {
        **FAIL_SUMMARY,
        "verdict": "INCONCLUSIVE",
        "reason": "the accuracy interval straddles -0.1%",
        "n_needed": 12000,
        "metrics": [{**FAIL_SUMMARY["metrics"][0], "verdict": "INCONCLUSIVE", "ci_low": -0.002}],
    }
    _only(notifiers("gate"), notify.WebhookNotifier)(gate_context(summary))
    text = webhook.requests[0]["body"]["text"]
    assert text.startswith("[embedfresh] Gate INCONCLUSIVE: tiny candidate 2026-01-02")
    assert "[-0.200%, -0.190%]" in text
    assert "larger held-out set" in text and "about 12000 examples" in text


def test_people_s_text_is_never_rendered_as_a_template(webhook):
    summary = {**FAIL_SUMMARY, "reason": "d is {{ 7 * 7 }} <b>off</b> & worse"}
    _only(notifiers("gate"), notify.WebhookNotifier)(gate_context(summary))
    text = webhook.requests[0]["body"]["text"]
    assert "d is {{ 7 * 7 }} &lt;b&gt;off&lt;/b&gt; &amp; worse" in text  # Slack's escapes
    assert "49" not in text


def test_people_s_text_reaches_the_email_verbatim_on_every_call(smtp):
    # Twice: a second message must not be the first's, nor rendered; the context's DAG
    # (a SimpleNamespace here, a SerializedDAG under dag.test()) has no template env.
    mail = _only(notifiers("gate"), notify.EmailNotifier)
    summary = {**FAIL_SUMMARY, "reason": "d is {{ 7 * 7 }} <b>off</b> & worse"}
    mail(gate_context(summary))
    mail(gate_context(summary))
    assert len(smtp.messages()) == 2
    for message in smtp.messages():
        body = message.get_body(preferencelist=("html",)).get_content()
        assert "d is {{ 7 * 7 }} &lt;b&gt;off&lt;/b&gt; &amp; worse" in body  # HTML escapes
        assert "49" not in body


def test_the_notifiers_refuse_the_async_path_they_do_not_implement(smtp, webhook):
    for notifier in notifiers("gate"):
        with pytest.raises(NotImplementedError):
            asyncio.run(notifier.async_notify(gate_context(FAIL_SUMMARY)))
    assert smtp.envelopes == [] and webhook.requests == []


def test_a_refused_webhook_fails_the_callback_loudly(webhook):
    webhook.status = 500
    hook = _only(notifiers("gate"), notify.WebhookNotifier)
    with pytest.raises(Exception, match="500"):
        hook(gate_context(FAIL_SUMMARY))


# -- failed runs, overrides, deadlines -----------------------------------------------------


def test_a_failed_run_names_its_dag_run_tasks_and_log(webhook):
    ti = FakeTI(task_id="train", state="failed", log_url="https://airflow.example.com/log/train")
    context = {  # what the dag-processor gives a DAG's on_failure_callback
        "dag": SimpleNamespace(dag_id="embedding_model_refresh"),
        "run_id": "scheduled__2026-01-02",
        "reason": "task_failure",
        "ti": ti,
        "params": {"model": "tiny"},
    }
    _only(notifiers("run_failed"), notify.WebhookNotifier)(context)

    text = webhook.requests[0]["body"]["text"]
    assert text.startswith(
        "[embedfresh] Run failed: embedding_model_refresh scheduled__2026-01-02 (train)"
    )
    assert "Failed tasks: train" in text
    assert "Airflow's reason: task_failure" in text
    assert "Task log: https://airflow.example.com/log/train" in text
    assert (
        "Run: https://airflow.example.com/dags/embedding_model_refresh/runs/scheduled__2026-01-02"
        in text
    )


def test_promote_anyway_and_rollback_say_who_and_why(env):
    promote = {
        "task": SimpleNamespace(model="tiny", who="alice", reason="outage fix", version="v7"),
        "ti": FakeTI(
            task_id="release", xcom={("release", -1): {"release": "rel-9", "production": "v7"}}
        ),
        "dag": SimpleNamespace(dag_id="embedfresh_promote_anyway"),
        "run_id": "manual__1",
    }
    message = build_message("promote_anyway", promote)
    assert message.subject == (
        "[embedfresh] Promote anyway: tiny version v7 (release rel-9) is live, by alice"
    )
    assert "although no quality gate passed it" in message.body
    assert "Reason given: outage fix" in message.body

    rollback = {  # the operator's ``who`` left empty: the run's triggering user
        "task": SimpleNamespace(model="tiny", who="", reason="bad vectors", release="rel-8"),
        "ti": FakeTI(task_id="move"),
        "dag_run": SimpleNamespace(triggering_user_name="bob", conf={}),
        "dag": SimpleNamespace(dag_id="embedfresh_rollback"),
        "run_id": "manual__2",
    }
    message = build_message("rollback", rollback)
    assert message.subject == "[embedfresh] Rollback: tiny release rel-8 is live again, by bob"
    assert "Reason given: bad vectors" in message.body

    failed = {**rollback, "exception": RuntimeError("release rel-8 is past retention")}
    message = build_message("rollback", failed)
    assert message.subject.endswith("by bob failed")
    assert "the live release stays as it was" in message.body


def test_a_deadline_breach_is_told_and_a_failing_channel_spares_the_other(smtp, webhook):
    webhook.status = 500  # the webhook refuses; the e-mail still goes
    sent = notify_deadline_breach(
        model="tiny",
        run_id="scheduled__2026-01-02",
        dag_id="embedding_model_refresh",
        deadline_time="2026-01-02T06:00:00+00:00",
        interval_seconds=6 * 3600,
        late_seconds=12 * 60,
        state="running",
        record_url="file:///store/runs/tiny/scheduled__2026-01-02/reports/deadline.json",
    )
    assert sent == 1
    assert len(webhook.requests) == 1  # tried
    (message,) = smtp.messages()
    assert message["Subject"] == (
        "[embedfresh] Deadline missed: embedding_model_refresh run scheduled__2026-01-02 "
        "(tiny), 12 min late"
    )
    body = message.get_body(preferencelist=("html",)).get_content()
    assert "Its time budget: 6.0 h from being queued." in body
    assert "Its state at the deadline: running." in body
    assert "reports/deadline.json" in body
