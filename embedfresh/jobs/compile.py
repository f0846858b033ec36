"""The compile job: ``python -m embedfresh.jobs.compile --config compile.yaml``.

A trial of the real training run, shortened to ``trial_steps`` training steps, one
evaluation and one checkpoint save, trains in a throwaway store (one day of data and the
eval split copied into a temporary directory; nothing of the real run is touched), so
every graph of the run is traced and compiled once. What it leaves is stored under
``compile-cache/{backend}/{key}/`` and counts once its COMMIT marker is written; a key
already committed is a cache hit and the job ends in seconds. Per mode:

- ``torch.compile`` (cpu/cuda): the trial runs in this process with a fresh
  ``TORCHINDUCTOR_CACHE_DIR``; the mega-cache and an archive of that directory are the
  entry, restored by the train job before it compiles.
- ``eager``: nothing to compile; the report says so.
- ``xla-trace``: the trial (``python -m embedfresh.jobs.train``) proves graph coverage and reports
  the graph count (XLA ``CompileTime``). The CPU PJRT persistent cache cannot be read
  back (FACTS.md), so nothing is claimed reusable: the entry records the coverage only.
- ``neuron_parallel_compile``: the trial command runs under ``neuron_parallel_compile``
  with the environment of :func:`embedfresh.ml.compile.neuron.neuron_env`, which the train job
  uses too; Neuron fills ``NEURON_COMPILE_CACHE_URL`` and the entry records its summary.

Report: ``runs/{model}/{run_id}/reports/compile.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from embedfresh.core import layout, markers
from embedfresh.core.cli import main_for
from embedfresh.core.config import CompileConfig, TrainConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.compile import modes, torch_cache
from embedfresh.ml.compile.key import cache_key, key_parts
from embedfresh.ml.compile.neuron import cache_root, neuron_env, parse_summary
from embedfresh.ml.data.reader import partition_days

log = logging.getLogger("embedfresh.jobs.compile")

#: Files a cache-entry marker carries besides the listing (the entry's own report).
ENTRY_META = "compile"


def compile_job(cfg: CompileConfig) -> dict[str, Any]:
    """Trace and compile every graph of the training run ``cfg`` describes, once per key."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    cache = cache_root(cfg)
    backend = modes.resolve_backend(cfg.backend)
    mode = modes.resolve_mode(cfg.compile, backend, cfg.model)
    key = cache_key(cfg, backend, mode)
    entry = layout.compile_cache(backend, key)
    # Checked in every mode: a compile step that passes must not hide missing data.
    day = cfg.with_day(
        partition_days(store, cfg.dataset), store.url(layout.train_partitions(cfg.dataset))
    ).data_interval_start
    base = {
        "status": "ok",
        "model": cfg.model,
        "run_id": cfg.run_id,
        "backend": backend,
        "mode": mode,
        "key": key,
        "key_parts": key_parts(cfg, backend, mode),
        "cache_url": _cache_url(cfg, cache, backend, entry),
        "warm_seconds_to_first_step": None,
    }
    if mode == modes.EAGER:
        report = {
            **base,
            "cache_hit": False,
            "graphs": 0,
            "cold_seconds_to_first_step": None,
            "size_bytes": 0,
            "created_at": _now(),
            "message": f"eager: nothing to compile (compile={cfg.compile} on {backend})",
        }
    elif markers.verify(cache, entry).ok:
        stored = markers.read_marker(cache, entry)[ENTRY_META]
        report = {
            **base,
            **{k: stored.get(k) for k in ("graphs", "cold_seconds_to_first_step", "created_at")},
            "cache_hit": True,
            "size_bytes": _entry_size(cache, entry),
            "message": f"cache hit: {cache.url(entry)} already holds key {key}",
        }
    else:
        with tempfile.TemporaryDirectory(prefix="compile-trial-") as tmp:
            trial_store = ArtifactStore(f"file://{tmp}/store")
            trial_cfg = trial_config(cfg, store, trial_store, backend, day)
            files, found = _run_trial(cfg, trial_cfg, trial_store, mode, Path(tmp))
        created = _now()
        stored = {"created_at": created, **found}
        markers.publish(
            cache, entry, files, meta={ENTRY_META: stored, "key_parts": base["key_parts"]}
        )
        report = {
            **base,
            **found,
            "cache_hit": False,
            "size_bytes": sum(len(v) for v in files.values()),
            "created_at": created,
            "message": f"compiled: {found.get('graphs')} graphs ({mode}) stored at {cache.url(entry)}",
        }
    report["wall_seconds"] = round(time.perf_counter() - started, 3)
    report_rel = layout.report(cfg.model, cfg.run_id, "compile")
    store.write_json(report_rel, report)
    log.info("%s", report["message"])
    keys = ("status", "backend", "mode", "key", "cache_hit", "graphs", "size_bytes", "message")
    return {**{k: report.get(k) for k in keys}, "report": store.url(report_rel)}


def trial_config(
    cfg: CompileConfig,
    store: ArtifactStore,
    trial_store: ArtifactStore,
    backend: str,
    day: dt.date,
) -> TrainConfig:
    """The real run's training config shortened to a trial in ``trial_store``: same model,
    shapes, backend, compile mode and flags; ``trial_steps`` steps, an evaluation at the
    last one and a checkpoint before it; base weights (graphs do not depend on them)."""
    _copy_data(store, trial_store, cfg.dataset, day)
    data = cfg.model_dump(exclude=set(CompileConfig.model_fields) - set(TrainConfig.model_fields))
    data.update(
        artifact_root=trial_store.root,
        compile_cache_root=cfg.compile_cache_root or store.root,
        run_id=f"{cfg.run_id}-compile-trial",
        version=None,
        backend=backend,
        data_interval_start=day,
        data_interval_end=day + dt.timedelta(days=1),
        max_steps=cfg.trial_steps,
        eval_every=cfg.trial_steps,
        checkpoint_every=cfg.trial_steps - 1,
        init="base",
        init_version=None,
    )
    return TrainConfig.model_validate(data)


def _copy_data(store: ArtifactStore, trial: ArtifactStore, dataset: str, day: dt.date) -> None:
    for directory in (layout.dataset_partition(dataset, "train", day), layout.eval_split(dataset)):
        names = store.listdir(directory)
        if not names:
            raise BadInputError(f"the trial run needs {store.url(directory)}, which is empty")
        for name in names:
            trial.write_bytes(f"{directory}/{name}", store.read_bytes(f"{directory}/{name}"))


def _run_trial(
    cfg: CompileConfig, trial_cfg: TrainConfig, trial_store: ArtifactStore, mode: str, tmp: Path
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Run the trial; returns the entry's files and the figures it found."""
    report_rel = layout.report(trial_cfg.model, trial_cfg.run_id, "train")
    if mode == modes.TORCH_COMPILE:
        # In this process: the mega-cache is what this process compiled. The training
        # code is the train job's own (embedfresh.ml.training); a job never imports a job.
        from embedfresh.ml.training import TrainingRun  # noqa: PLC0415 - imports torch

        inductor_dir = torch_cache.fresh_inductor_dir()
        try:
            # On cpu, inductor's check of the CPU's vector ISAs, which it would otherwise
            # run at its first compile: a cold start pays it, so the cold figure counts it.
            checked = time.perf_counter()
            vec_isa = torch_cache.check_vec_isa() if trial_cfg.backend == "cpu" else {}
            check_seconds = time.perf_counter() - checked
            with torch_cache.vec_isa_setting(vec_isa), TrainingRun.open(trial_cfg) as run:
                # No version published: the trial's figures and graphs are the training's.
                report = run.report(run.fit(), version_url=None)
            files = torch_cache.collect(inductor_dir, vec_isa)
        finally:
            shutil.rmtree(inductor_dir, ignore_errors=True)
        found = _trial_figures(report)
        if found["cold_seconds_to_first_step"] is not None:
            found["cold_seconds_to_first_step"] += check_seconds
        if vec_isa:
            found["vec_isa"] = {**vec_isa, "check_seconds": round(check_seconds, 3)}
        return files, found

    config_file = tmp / "trial-train.json"
    config_file.write_text(trial_cfg.model_dump_json())
    command = [sys.executable, "-m", "embedfresh.jobs.train", "--config", str(config_file)]
    env = dict(os.environ)
    if mode == modes.NEURON_PARALLEL_COMPILE:
        tool = shutil.which(cfg.neuron_parallel_compile)
        if tool is None:
            raise BadInputError(
                f"{cfg.neuron_parallel_compile!r} is not on PATH: the neuron compile step "
                "runs on a Neuron host with torch-neuronx installed"
            )
        command = [tool, *command]
        env.update(neuron_env(cfg))
        if cfg.neuron_max_retries is not None:
            env["NEURON_PARALLEL_COMPILE_MAX_RETRIES"] = str(cfg.neuron_max_retries)
    output = _run(command, env, cfg.timeout_seconds, tmp)
    if mode == modes.XLA_TRACE:
        found = _trial_figures(trial_store.read_json(report_rel))
        found["note"] = (
            "graph coverage proven; the CPU PJRT persistent cache cannot be read back, "
            "so the real run compiles these graphs again"
        )
        return {"coverage.json": json.dumps(found, sort_keys=True).encode()}, found
    summary = parse_summary(output)
    if summary is None:
        raise RuntimeError(
            "neuron_parallel_compile printed no summary ('Total graphs: N'); see its log above"
        )
    if summary.get("failed"):
        raise RuntimeError(
            f"neuron_parallel_compile: {summary['failed']} of {summary['graphs']} graphs "
            "failed to compile; see its log above"
        )
    found = {
        "graphs": summary["graphs"],
        "summary": summary,
        "command": command,
        "cold_seconds_to_first_step": None,
        "neuron_env": neuron_env(cfg),
    }
    return {"summary.json": json.dumps(found, sort_keys=True).encode()}, found


def _run(command: list[str], env: dict[str, str], timeout: float, cwd: Path) -> str:
    """Run the trial command, its output passed through to our log; returns the output."""
    log.info("trial: %s", " ".join(command))
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"trial run exceeded {timeout} s: {' '.join(command)}") from e
    sys.stderr.write(done.stdout)
    if done.returncode != 0:
        if done.returncode == 2:  # the trial refused its config: so would the real run
            raise BadInputError(f"trial run refused its config (exit 2): {done.stdout[-500:]}")
        raise RuntimeError(f"trial run failed with exit code {done.returncode}")
    return done.stdout


def _trial_figures(train_report: dict[str, Any]) -> dict[str, Any]:
    return {
        "graphs": train_report.get("compiles"),
        "cold_seconds_to_first_step": train_report.get("seconds_to_first_step"),
        "compiles_after_warmup": train_report.get("compiles_after_warmup"),
        "trial_steps": train_report.get("steps"),
    }


def _cache_url(cfg: CompileConfig, cache: ArtifactStore, backend: str, entry: str) -> str:
    if backend == "neuron":
        return neuron_env(cfg)["NEURON_COMPILE_CACHE_URL"]
    return cache.url(entry)


def _entry_size(store: ArtifactStore, entry: str) -> int:
    marker = markers.read_marker(store, entry) or {"files": {}}
    return sum(int(f.get("size", 0)) for f in marker["files"].values())


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


if __name__ == "__main__":
    main_for("compile", CompileConfig, compile_job)
