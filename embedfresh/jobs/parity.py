"""Backend parity: ``python -m embedfresh.jobs.parity --config parity.yaml``.

Trains the same start version (``init_version``) with identical hyperparameters on
backend A and backend B (default ``cpu`` and ``xla``), each as its own ``embedfresh.jobs.train``
process (run ids ``{run_id}-{backend}``), evaluating every ``eval_every`` steps. Then it
gates B's curve against A's in parity mode (:func:`embedfresh.ml.gate.decision.gate_curve`:
two-sided |d| < tolerance, with paired bootstrap intervals, at every common evaluation
point) and writes ``runs/{model}/{run_id}/reports/gate.json`` with the verdict, every
point, the largest |d| (step and metric), and ``gate.svg`` (the page's chart of the
decision, :mod:`embedfresh.core.quality_chart`: each metric's d against the tolerance
band, one panel per step). Anything but PASS exits with code 3, like the gate job.

``step`` splits it for machines of one backend each (AWS Batch job definitions): ``a``
and ``b`` train one side, ``compare`` gates the two curves once both are there
(``dags/accelerator_parity.py`` runs it so); ``all`` (default) does the three in turn.

Config against config: ``config_a`` / ``config_b`` give one side training fields of its
own (``{"parallelism": "hsdp"}`` against ddp, on the same backend), and the same gate
proves the two ways of training give the same model.

Each side is a separate process because torch-xla, once imported, changes process-wide
state, and so that a side can be resumed (its run id) after a failure. A side run under
a launch of several ranks (``torchrun``, a multi-node Batch job: step ``a`` or ``b``)
trains on all of them: each rank's training process inherits its rank's environment
(``RANK``, ``WORLD_SIZE``, the rendezvous address) and joins the launch's process group
in its place.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from embedfresh.core import layout, quality_chart
from embedfresh.core.cli import main_for
from embedfresh.core.config import ParityConfig, TrainConfig
from embedfresh.core.exit_codes import BadInputError, ExitCode, GateRefusedError, TransientError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.gate.decision import CurvePoint, CurveResult, gate_curve
from embedfresh.ml.gate.outcomes import load_outcomes
from embedfresh.ml.gate.publish import publish_decision

log = logging.getLogger("embedfresh.jobs.parity")


def run_train(cfg: TrainConfig, timeout: float) -> dict[str, Any]:
    """Run ``python -m embedfresh.jobs.train`` on ``cfg`` as a subprocess; returns its summary.

    Its exit code carries over: 75 (transient) stays retryable, anything else is
    reported as bad input with the end of the side's stderr.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(cfg.model_dump_json())
        path = f.name
    log.info("training %s on %s", cfg.run_id, cfg.backend)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "embedfresh.jobs.train", "--config", path],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        raise TransientError(f"training {cfg.run_id} ran past {timeout:.0f} s") from e
    finally:
        os.unlink(path)
    sys.stderr.write(proc.stderr[-4000:] if proc.returncode else "")
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        message = f"training {cfg.run_id} on {cfg.backend} exited {proc.returncode}: {tail[0]}"
        if proc.returncode == ExitCode.TRANSIENT:
            raise TransientError(message)
        raise BadInputError(message)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parity(cfg: ParityConfig) -> dict[str, Any]:
    """Train on both backends from the same version and gate the two curves (``step``:
    both sides and the gate, one side, or the gate of two sides trained before)."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    if cfg.step in ("a", "b"):
        tcfg = cfg.train_config(cfg.step)
        summary = run_train(tcfg, cfg.timeout_seconds)
        return {"side": cfg.step, "backend": tcfg.backend, "run_id": tcfg.run_id, **summary}
    sides = {side: _trained(store, cfg, side) for side in ("a", "b")}
    steps_a = {p["step"] for p in sides["a"]["report"].get("eval_curve", [])}
    steps_b = {p["step"] for p in sides["b"]["report"].get("eval_curve", [])}
    common = sorted(steps_a & steps_b)
    if not common:
        raise BadInputError(
            f"the two runs share no evaluation step ({sorted(steps_a)} vs {sorted(steps_b)})"
        )
    points = [
        (
            step,
            _outcomes(store, cfg, sides["b"]["cfg"], step),
            _outcomes(store, cfg, sides["a"]["cfg"], step),
        )
        for step in common
    ]
    curve: CurveResult = gate_curve(
        points,
        cfg.metrics,
        "parity",
        cfg.tolerance,
        cfg.resamples,
        cfg.confidence,
        cfg.gate_seed,
    )
    details = {
        "init_version": cfg.init_version,
        "eval_every": cfg.eval_every,
        "steps": common,
        "candidate": _side(sides["b"]),
        "reference": _side(sides["a"]),
        "curve": [_point(p) for p in curve.points],
    }
    # The chart the page draws of a parity decision, the gate's own (one library).
    svg = quality_chart.render_svg(quality_chart.gate_chart_spec({**curve.to_dict(), **details}))
    report_url = publish_decision(
        store, cfg.model, cfg.run_id, svg, curve.to_dict(), details, started
    )
    log.info(
        "parity %s (%s vs %s): %s", curve.verdict, _label(cfg, "b"), _label(cfg, "a"), curve.reason
    )
    if curve.verdict != "PASS":
        raise GateRefusedError(
            f"{curve.reason} ({_label(cfg, 'b')} vs {_label(cfg, 'a')}; report {report_url})"
        )
    return {
        "verdict": str(curve.verdict),
        "reason": curve.reason,
        "max_abs_d": curve.max_abs_d,
        "report": report_url,
    }


def _trained(store: ArtifactStore, cfg: ParityConfig, side: str) -> dict[str, Any]:
    """One side trained (``step=all``) or found trained, from ``init_version``."""
    tcfg = cfg.train_config(side)
    summary = run_train(tcfg, cfg.timeout_seconds) if cfg.step == "all" else None
    rel = layout.report(cfg.model, tcfg.run_id, "train")
    if not store.exists(rel):
        raise BadInputError(
            f"side {side} ({tcfg.backend}) has no training report {store.url(rel)}: run "
            f"the parity job with step={side} first"
        )
    train_report = store.read_json(rel)
    started_from = (train_report.get("init") or {}).get("version")
    if cfg.step == "compare" and started_from != cfg.init_version:
        raise BadInputError(
            f"side {side} ({tcfg.run_id}) trained from version {started_from}, not "
            f"{cfg.init_version}: both sides must start from the same version; run "
            f"step={side} again"
        )
    config = getattr(cfg, f"config_{side}")
    return {"cfg": tcfg, "summary": summary, "report": train_report, "config": config}


def _point(p: CurvePoint) -> dict[str, Any]:
    """One evaluation step of the curve as the report lists it."""
    return {
        "step": p.step,
        "verdict": str(p.result.verdict),
        "max_abs_d": max(
            (abs(m.bootstrap.d) for m in p.result.metrics if m.bootstrap), default=None
        ),
        "d": {m.metric: m.bootstrap.d for m in p.result.metrics if m.bootstrap},
    }


def _outcomes(
    store: ArtifactStore, cfg: ParityConfig, side: TrainConfig, step: int
) -> dict[str, dict[str, Any]]:
    rel = layout.report(cfg.model, side.run_id, layout.eval_step_report(step))
    if not store.exists(rel):
        raise BadInputError(f"run {side.run_id} lacks its evaluation at step {step}")
    return load_outcomes(store, store.read_json(rel))


def _label(cfg: ParityConfig, side: str) -> str:
    """A side as a person names it: its backend, and its own training fields if any."""
    backend, config = getattr(cfg, f"backend_{side}"), getattr(cfg, f"config_{side}")
    return f"{backend} {json.dumps(config, sort_keys=True)}" if config else backend


def _side(side: dict[str, Any]) -> dict[str, Any]:
    rep, tcfg = side["report"], side["cfg"]
    return {
        "backend": tcfg.backend,
        "config": side["config"],
        "run_id": tcfg.run_id,
        "version": rep["version"],
        "device": rep.get("device"),
        "dropout": rep.get("dropout"),
        "final_loss": rep.get("final_loss"),
        "eval_curve": rep.get("eval_curve", []),
    }


if __name__ == "__main__":
    main_for("parity", ParityConfig, parity)
