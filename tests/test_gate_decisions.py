"""Gates and releases as operators another team composes: a decision is not an error,
reports are keyed by task, and a release names the gate it follows (refusing an
ambiguous one when the DAG file is parsed)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from embedfresh.operators import EvaluationOperator, QualityGateOperator, ReleaseOperator
from embedfresh.operators.gate import decision_passed
from embedfresh.operators.reports import eval_report_name, gate_report_name

ARGS = {"artifact_root": "file:///r", "model": "tiny", "run_id": "r1"}
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def dag(dag_id: str) -> DAG:
    return DAG(dag_id, schedule=None, start_date=START)


def test_each_gate_and_evaluation_of_a_run_writes_its_own_report():
    assert (gate_report_name("gate"), gate_report_name("recall_gate")) == (
        "gate",
        "gate-recall_gate",
    )
    assert gate_report_name("recall_gate", 3) == "gate-recall_gate-3"  # mapped
    assert (eval_report_name("evaluate"), eval_report_name("eval_b")) == ("eval", "eval-eval_b")
    with dag("two_gates"):
        EvaluationOperator(task_id="evaluate", **ARGS)
        other = EvaluationOperator(task_id="eval_small", **ARGS)
        head = QualityGateOperator(
            task_id="head", **ARGS, metrics=["accuracy"], evaluation="evaluate"
        )
        recall = QualityGateOperator(task_id="recall", **ARGS, evaluation="eval_small")
    settings = [g.build_job_spec().settings for g in (head, recall)]
    assert [(s["report_name"], s["eval_report"]) for s in settings] == [
        ("gate-head", "eval"),
        ("gate-recall", "eval-eval_small"),
    ]
    assert other.build_job_spec().settings["report_name"] == "eval-eval_small"
    # The decision is the outcome in no_regression mode; parity mode's job still exits 3.
    assert settings[0]["refusal_exits"] is False


def test_an_ambiguous_gate_or_evaluation_is_refused_when_the_dag_is_parsed():
    with dag("ambiguous"), pytest.raises(ValueError, match="name it with evaluation="):
        EvaluationOperator(task_id="e1", **ARGS)
        EvaluationOperator(task_id="e2", **ARGS)
        QualityGateOperator(task_id="gate", **ARGS)
    with dag("two_gates_one_release"), pytest.raises(ValueError, match="name it with gate="):
        QualityGateOperator(task_id="g1", **ARGS)
        QualityGateOperator(task_id="g2", **ARGS)
        ReleaseOperator(task_id="release", **ARGS, corpora=["products"])
    with dag("wrong_kind"), pytest.raises(ValueError, match="not a QualityGateOperator"):
        EvaluationOperator(task_id="evaluate", **ARGS)
        ReleaseOperator(task_id="release", **ARGS, gate="evaluate")
    with dag("named"):
        QualityGateOperator(task_id="g1", **ARGS)
        QualityGateOperator(task_id="g2", **ARGS)
        release = ReleaseOperator(task_id="release", **ARGS, corpora=["products"], gate="g2")
    assert release.build_job_spec().settings["gate_report"] == "gate-g2"


class GateXCom:
    """A task instance whose gate returned ``decision``."""

    def __init__(self, decision: dict | None) -> None:
        self.decision = decision
        self.pulled: list[str] = []

    def xcom_pull(self, task_ids: str) -> dict | None:
        self.pulled.append(task_ids)
        return self.decision


@pytest.mark.parametrize("verdict", ["FAIL", "INCONCLUSIVE"])
def test_a_release_after_a_declined_gate_skips_itself(verdict: str):
    with dag(f"declined_{verdict}"):
        QualityGateOperator(task_id="gate", **ARGS)
        release = ReleaseOperator(task_id="release", **ARGS, corpora=["products"])
    assert release.gate == "gate"
    decision = {"verdict": verdict, "reason": "interval straddles", "report": "file:///g.json"}
    ti = GateXCom(decision)
    with pytest.raises(AirflowSkipException, match=f"gate 'gate' said {verdict}"):
        release.follow_gate({"ti": ti})
    assert ti.pulled == ["gate"]
    release.follow_gate({"ti": GateXCom({**decision, "verdict": "PASS"})})  # goes on
    # A person's override follows no gate.
    with dag(f"override_{verdict}"):
        QualityGateOperator(task_id="gate", **ARGS)
        anyway = ReleaseOperator(
            task_id="release", **ARGS, corpora=["products"], action="promote_anyway"
        )
    anyway.follow_gate({"ti": GateXCom(decision)})


def test_gate_passed_lets_only_a_pass_through(caplog: pytest.LogCaptureFixture):
    assert decision_passed({"verdict": "PASS", "reason": "all pass"}) is True
    declined = {"verdict": "INCONCLUSIVE", "candidate": "c1", "reason": "r", "report": "u"}
    assert decision_passed(declined) is False
    assert "gate INCONCLUSIVE for candidate c1" in caplog.text
    with pytest.raises(AirflowFailException, match="no decision"):
        decision_passed(None)


def test_the_release_skip_reads_the_gate_of_the_run(monkeypatch: pytest.MonkeyPatch):
    """follow_gate is what execute runs first: a declined gate never starts the job."""
    with dag("execute_skips"):
        QualityGateOperator(task_id="gate", **ARGS)
        release = ReleaseOperator(task_id="release", **ARGS, corpora=["products"])
    started = []
    monkeypatch.setattr(
        type(release).__mro__[1], "execute", lambda self, context: started.append(1)
    )
    context = {"ti": GateXCom({"verdict": "FAIL", "reason": "worse"}), "dag_run": SimpleNamespace()}
    with pytest.raises(AirflowSkipException):
        release.execute(context)
    assert started == []
