"""The compile job: ``python -m embedfresh.jobs.compile --config compile.yaml``.

A trial of the real training run, shortened to ``trial_steps`` training steps, one
evaluation and one checkpoint save, trains in a throwaway store (one day of data, the
eval split, the judgments and a corpus shard copied into a temporary directory; nothing
of the real run is touched), so every graph of the run is traced and compiled once.
What it leaves is stored under
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

The job runs under the launch train runs under (the DAG gives both the same
``nproc_per_node``), and the key holds that launch's world size
(:mod:`embedfresh.ml.compile.launch`). Under torchrun with several ranks the trial is
data parallel, as train is: with ``torch.compile`` every rank trains its shard in this
process; in the subprocess modes the first rank of each node starts the trial under
the same launch (``neuron_parallel_compile python -m embedfresh.jobs.launch
--standalone --nproc-per-node N -m embedfresh.jobs.train ...``). Global rank 0 alone
decides hit or miss, writes the cache entry, its marker and the report (and, through
:mod:`embedfresh.core.cli`, the result record); the other ranks wait for it and exit 0.

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
from embedfresh.core.parquet import read_parquet
from embedfresh.core.partitions import partition_days
from embedfresh.core.shards import corpus_shards
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.backends import sharding_refusal
from embedfresh.ml.compile import modes, torch_cache
from embedfresh.ml.compile.key import cache_key, key_parts
from embedfresh.ml.compile.launch import Launch, Ranks, child_env, free_port, join
from embedfresh.ml.compile.neuron import cache_root, neuron_env, parse_summary

log = logging.getLogger("embedfresh.jobs.compile")

#: Files a cache-entry marker carries besides the listing (the entry's own report).
ENTRY_META = "compile"

#: Seconds the other ranks wait for rank 0's writes beyond the trial's own limit.
WRITE_MARGIN_S = 900


def compile_job(cfg: CompileConfig) -> dict[str, Any]:
    """Trace and compile every graph of the training run ``cfg`` describes, once per key."""
    started = time.perf_counter()
    launch = Launch.from_env()
    store = ArtifactStore(cfg.artifact_root)
    cache = cache_root(cfg)
    backend = modes.resolve_backend(cfg.backend)
    if cfg.parallelism != "ddp" and (refusal := sharding_refusal(backend)):
        raise BadInputError(refusal)  # the run it would trace cannot run here
    mode = modes.resolve_mode(cfg.compile, backend, cfg.model, cfg.parallelism)
    # The train job's very call: the key of this launch's world size.
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
        "world_size": launch.world_size,
        "nodes": launch.nodes,
        "cache_url": _cache_url(cfg, cache, backend, entry),
        "warm_seconds_to_first_step": None,
    }
    # torch.compile trains in this process: its ranks join the group train joins (its
    # device's); the other modes only wait for rank 0, in a gloo group.
    group_backend = backend if mode == modes.TORCH_COMPILE else None
    with join(launch, group_backend, cfg.timeout_seconds + WRITE_MARGIN_S) as ranks:
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
        elif ranks.agree(markers.verify(cache, entry).ok if launch.is_main else None):
            report = _hit_report(base, cache, entry) if launch.is_main else {**base}
        else:
            report = _compile(cfg, store, cache, entry, base, backend, mode, day, ranks)
        report["wall_seconds"] = round(time.perf_counter() - started, 3)
        report_rel = layout.report(cfg.model, cfg.run_id, "compile")
        if launch.is_main:
            store.write_json(report_rel, report)
            log.info("%s", report["message"])
        ranks.wait_for_main()  # the others leave once rank 0 wrote everything
    if not launch.is_main:  # rank 0 alone writes the entry, the report and the record
        return {"status": "ok", "rank": launch.rank, "key": key, "mode": mode}
    keys = ("status", "backend", "mode", "key", "cache_hit", "graphs", "size_bytes", "message")
    return {**{k: report.get(k) for k in keys}, "report": store.url(report_rel)}


def _hit_report(base: dict[str, Any], cache: ArtifactStore, entry: str) -> dict[str, Any]:
    stored = markers.read_marker(cache, entry)[ENTRY_META]
    return {
        **base,
        **{k: stored.get(k) for k in ("graphs", "cold_seconds_to_first_step", "created_at")},
        "cache_hit": True,
        "size_bytes": _entry_size(cache, entry),
        "message": f"cache hit: {cache.url(entry)} already holds key {base['key']}",
    }


def _compile(
    cfg: CompileConfig,
    store: ArtifactStore,
    cache: ArtifactStore,
    entry: str,
    base: dict[str, Any],
    backend: str,
    mode: str,
    day: dt.date,
    ranks: Ranks,
) -> dict[str, Any]:
    """Run the trial (every rank its part) and, on rank 0, publish the entry; returns the
    report (rank 0's; the base elsewhere)."""
    launch = ranks.launch
    master = None
    if mode != modes.TORCH_COMPILE and launch.nodes > 1:  # the trial launch's rendezvous
        here = (os.environ.get("MASTER_ADDR", "127.0.0.1"), free_port())
        master = ranks.agree(here if launch.is_main else None)
    with tempfile.TemporaryDirectory(prefix="compile-trial-") as tmp:
        trial_store = ArtifactStore(f"file://{tmp}/store")
        trial_cfg = trial_config(cfg, store, trial_store, backend, day)
        # This rank's part of the trial: the entry's files and the figures it found
        # (rank 0's; empty on the other ranks).
        if mode == modes.TORCH_COMPILE:
            files, found = _torch_compile_trial(trial_cfg, ranks)
        else:
            files, found = _subprocess_trial(
                cfg, trial_cfg, trial_store, mode, Path(tmp), ranks, master
            )
    if not launch.is_main:
        return {**base}
    created = _now()
    stored = {"created_at": created, **found}
    markers.publish(cache, entry, files, meta={ENTRY_META: stored, "key_parts": base["key_parts"]})
    return {
        **base,
        **found,
        "cache_hit": False,
        "size_bytes": sum(len(v) for v in files.values()),
        "created_at": created,
        "message": f"compiled: {found.get('graphs')} graphs ({mode}) stored at {cache.url(entry)}",
    }


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
        eval_queries=TRIAL_QUERIES,
        checkpoint_every=cfg.trial_steps - 1,
        init="base",
        init_version=None,
    )
    return TrainConfig.model_validate(data)


#: Judged queries the trial's evaluation searches: its graphs, not its figures, count.
TRIAL_QUERIES = 64


def _copy_data(store: ArtifactStore, trial: ArtifactStore, dataset: str, day: dt.date) -> None:
    """What the trial's training and its evaluation (search included) read: one day's
    pairs and the eval split's (if any) with their documents' texts inline (the trial
    holds one shard of the corpus), the data set's declaration, its judgments and the
    first shard of the corpus they judge."""
    from embedfresh.ml.data.generate import parquet_bytes
    from embedfresh.ml.data.judgments import corpus_of, pairs_corpus
    from embedfresh.ml.data.reader import with_texts

    corpus = corpus_of(store, dataset, None)  # the judged one: its first shard is copied
    texts_from = pairs_corpus(store, dataset)
    judgments = layout.judgments(dataset)
    train, evals = layout.dataset_partition(dataset, "train", day), layout.eval_split(dataset)
    for directory in (train, evals, judgments):
        names = store.listdir(directory)
        if not names and directory != evals:
            raise BadInputError(f"the trial run needs {store.url(directory)}, which is empty")
        for name in names:
            rel = f"{directory}/{name}"
            if directory == judgments or not name.endswith(".parquet"):
                trial.write_bytes(rel, store.read_bytes(rel))
                continue
            table = with_texts(store, read_parquet(store, rel), texts_from, store.url(rel))
            trial.write_bytes(rel, parquet_bytes(table))
    if store.exists(declaration := layout.dataset_declaration(dataset)):
        trial.write_bytes(declaration, store.read_bytes(declaration))
    first = next(iter(corpus_shards(store, corpus).values()))
    rel = f"{layout.corpus(corpus)}/{first}"
    trial.write_bytes(rel, store.read_bytes(rel))


def _torch_compile_trial(
    trial_cfg: TrainConfig, ranks: Ranks
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The trial in this process: the mega-cache is what this process compiled. The
    training code is the train job's own (embedfresh.ml.training); a job never imports a
    job. Under torchrun every rank trains its shard (the group is the job's, joined
    already), as train does; rank 0's caches hold every graph (the same on each rank,
    and the evaluation's, which rank 0 alone runs)."""
    from embedfresh.ml.training import TrainingRun  # noqa: PLC0415 - imports torch

    launch = ranks.launch
    inductor_dir = torch_cache.fresh_inductor_dir()
    try:
        # On cpu, inductor's check of the CPU's vector ISAs, which it would otherwise
        # run at its first compile: a cold start pays it, so the cold figure counts it.
        # Rank 0 checks; a rank whose CPU offers the same ISAs takes its answer, as a
        # restore does (N ranks of one node would otherwise each build the tests).
        checked = time.perf_counter()
        vec_isa: dict[str, Any] = {}
        if trial_cfg.backend == "cpu" and launch.is_main:
            vec_isa = ranks.agree(torch_cache.check_vec_isa())
        elif trial_cfg.backend == "cpu":
            vec_isa = torch_cache.same_cpu_vec_isa(ranks.agree(None))
        check_seconds = time.perf_counter() - checked
        with torch_cache.vec_isa_setting(vec_isa), TrainingRun.open(trial_cfg) as run:
            # No version published: the trial's figures and graphs are the training's.
            report = run.report(run.fit(), version_url=None)
        if not launch.is_main:
            return {}, {}
        files = torch_cache.collect(inductor_dir, vec_isa)
    finally:
        shutil.rmtree(inductor_dir, ignore_errors=True)
    found = _trial_figures(report)
    if found["cold_seconds_to_first_step"] is not None:
        found["cold_seconds_to_first_step"] += check_seconds
    if vec_isa:
        found["vec_isa"] = {**vec_isa, "check_seconds": round(check_seconds, 3)}
    return files, found


def _subprocess_trial(
    cfg: CompileConfig,
    trial_cfg: TrainConfig,
    trial_store: ArtifactStore,
    mode: str,
    tmp: Path,
    ranks: Ranks,
    master: tuple[str, int] | None,
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The trial as the train job under the launch's shape: traced by torch-xla, or under
    ``neuron_parallel_compile``, which compiles the node's graphs and says so."""
    launch = ranks.launch
    report_rel = layout.report(trial_cfg.model, trial_cfg.run_id, "train")
    if not launch.is_node_main:  # the node's first rank starts the trial for the node
        return {}, {}
    config_file = tmp / "trial-train.json"
    config_file.write_text(trial_cfg.model_dump_json())
    # The launch train runs under (one process, or torchrun with this launch's shape),
    # started afresh: torchrun's variables of this job's own launch are not passed on.
    command = launch.trial_command(
        sys.executable, "embedfresh.jobs.train", ["--config", str(config_file)], master=master
    )
    env = child_env(os.environ) if launch.distributed else dict(os.environ)
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
        if not launch.is_main:
            return {}, {}
        found = _trial_figures(trial_store.read_json(report_rel))
        found["note"] = (
            "graph coverage proven; the CPU PJRT persistent cache cannot be read back, "
            "so the real run compiles these graphs again"
        )
        return {"coverage.json": json.dumps(found, sort_keys=True).encode()}, found
    # Each node's tool compiles its node's graphs and says so: any failure fails the job.
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
    if not launch.is_main:
        return {}, {}
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
