"""Evaluation points during training and the backend parity job (DESIGN "The quality
gate", parity mode): the same start version trained on two backends, the two curves
gated point by point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.gate.outcomes import load_outcomes
from embedfresh.ml.model.versions import ensure_baseline
from tests.conftest import run_job
from tests.test_train_resume import weights_sha

XLA_ENV = {"PJRT_DEVICE": "CPU"}
STEPS, EVERY = 4, 2
TRAIN = (
    "data_interval_start=2026-01-01",
    "epochs=1",
    f"max_steps={STEPS}",
    "log_every=1",
    "init_version=baseline",
)


def report(root: str, run_id: str, name: str) -> dict:
    path = Path(root.removeprefix("file://")) / "runs/tiny" / run_id / "reports" / f"{name}.json"
    return json.loads(path.read_text())


@pytest.fixture
def start(root: str) -> str:
    """The pinned start version both sides load (the tiny config's random init)."""
    return ensure_baseline(ArtifactStore(root), "tiny", "baseline", 0)


def train(root: str, run_id: str, *sets: str) -> dict:
    result = run_job("train", f"artifact_root={root}", f"run_id={run_id}", *TRAIN, *sets)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_eval_points_are_reported_and_do_not_change_training(root, start):
    summary = train(root, "with-eval", "eval_every=3")
    assert summary["init"]["source"] == "version" and summary["init"]["version"] == start
    rep = report(root, "with-eval", "train")
    assert [p["step"] for p in rep["eval_curve"]] == [3, STEPS]  # every 3 steps + the last
    store = ArtifactStore(root)
    for point in rep["eval_curve"]:
        ev = report(root, "with-eval", f"eval-step-{point['step']:08d}")
        assert ev["metrics"] == point["metrics"] and ev["step"] == point["step"]
        outcomes = load_outcomes(store, ev)  # the gate reads them like eval.json's
        assert len(outcomes["relevance"]["prob"]) == ev["n_examples"]
    # Evaluating draws no randomness the training sees: same weights as without it.
    train(root, "without-eval")
    assert weights_sha(root, "with-eval") == weights_sha(root, "without-eval")
    # The last point is what the evaluate job measures on the published version.
    result = run_job("evaluate", f"artifact_root={root}", "run_id=with-eval")
    assert result.returncode == 0, result.stderr[-3000:]
    assert report(root, "with-eval", "eval")["metrics"] == rep["eval_curve"][-1]["metrics"]


def parity(root: str, run_id: str, backend_b: str, *sets: str):
    return run_job(
        "parity",
        f"artifact_root={root}",
        f"run_id={run_id}",
        *TRAIN,
        f"eval_every={EVERY}",
        f"backend_b={backend_b}",
        "resamples=200",
        *sets,
        env=XLA_ENV,
    )


def test_same_backend_twice_is_exact_parity(root, start):
    result = parity(root, "cc", "cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    gate = report(root, "cc", "gate")
    assert gate["verdict"] == "PASS" and gate["mode"] == "parity"
    assert gate["max_abs_d"] == 0.0
    assert gate["steps"] == [2, 4] and [p["step"] for p in gate["points"]] == [2, 4]
    assert gate["candidate"]["run_id"] == "cc-cpu-b" and gate["reference"]["run_id"] == "cc-cpu-a"
    # The page's chart of the decision: a panel per step, each with the tolerance band
    # and one point per metric.
    svg = Path(gate["plot"].removeprefix("file://")).read_text()
    metrics = len(gate["points"][0]["metrics"])
    assert svg.count("role-mark tolerance_band_marks") == 2, svg[:500]
    assert svg.count("role-mark point_marks") == 2
    assert svg.count('aria-roledescription="point"') == 2 * metrics
    assert ">Gate PASS: parity<" in svg and ">evaluation step<" in svg


def test_sides_in_jobs_of_their_own_then_the_comparison(root, start):
    """step=a and step=b train one side each (a machine per backend, as the DAG runs
    them); compare gates them as the one-job form does; compare before a side is there,
    or over a side from another start version, is refused before any write."""
    early = parity(root, "split", "cpu", "step=compare")
    assert early.returncode == 2 and "run the parity job with step=a first" in early.stderr
    for side in ("a", "b"):
        done = parity(root, "split", "cpu", f"step={side}")
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["side"] == side and summary["run_id"] == f"split-cpu-{side}"
    compared = parity(root, "split", "cpu", "step=compare")
    assert compared.returncode == 0, compared.stderr[-3000:]
    gate = report(root, "split", "gate")
    assert gate["verdict"] == "PASS" and gate["max_abs_d"] == 0.0 and gate["steps"] == [2, 4]
    other = parity(root, "split", "cpu", "step=compare", "init_version=other-start")
    assert other.returncode == 2 and "trained from version baseline" in other.stderr


def test_cpu_vs_xla_parity_reports_max_abs_d_and_a_verdict(root, start):
    result = parity(root, "cx", "xla")
    assert result.returncode in (0, 3), result.stderr[-3000:]
    gate = report(root, "cx", "gate")
    assert gate["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
    assert (result.returncode == 0) == (gate["verdict"] == "PASS")
    assert isinstance(gate["max_abs_d"], float)
    assert gate["max_abs_d_step"] in (2, 4) and gate["max_abs_d_metric"]
    assert gate["candidate"]["backend"] == "xla" and gate["reference"]["backend"] == "cpu"
    xla = report(root, "cx-xla", "train")
    assert [p["step"] for p in xla["eval_curve"]] == [2, 4]
    assert xla["compiles_after_warmup"] == 0 and xla["eval_compiles"] > 0
    # On xla too, evaluating (its syncs advance the device's seed) leaves training as is.
    run = run_job(
        "train", f"artifact_root={root}", "run_id=xla-no-eval", *TRAIN, "backend=xla", env=XLA_ENV
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert weights_sha(root, "cx-xla") == weights_sha(root, "xla-no-eval")
