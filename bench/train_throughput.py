"""Training throughput and utilisation on this CPU: samples/s for the tiny and minilm
configs, eager vs torch.compile, and achieved FLOP/s over the machine's matmul peak.

Run on demand, not in CI::

    .venv/bin/python bench/train_throughput.py [--models tiny,minilm] [--rounds 5]
        [--threads 2] [--no-append]

What it drives: the train job's own step loop, :meth:`embedfresh.ml.training.Trainer.run`,
called in chunks of steps on the job's own pieces (:func:`embedfresh.ml.model.versions.build_model`,
:func:`embedfresh.ml.training.make_optimizer` / ``make_schedule``,
:class:`embedfresh.ml.training.TrainingSet` from a generated partition read back by
:func:`embedfresh.ml.data.reader.read_train`), with the
model config's batch size and padded length. Checkpointing and logging are pushed past
the end (``checkpoint_every``/``log_every`` huge), so a chunk times forward, the
relevance + in-batch contrastive loss, backward, gradient clipping, AdamW and the LR
schedule. One sample = one (query, product) pair: two sequences through the encoder.

Per model config, in one process: a few warm-up steps per variant, then ``--rounds``
rounds in which every variant runs one chunk (order rotated each round); samples/s is
the median over rounds, and the compiled/eager ratio comes from that same run.

Utilisation: the FLOPs of one training step are counted by
``torch.utils.flop_counter.FlopCounterMode`` (measured: matmuls and attention forward
and backward; with dropout > 0 CPU attention takes SDPA's math path, i.e. bmm, which
is counted; with dropout 0 it takes the CPU flash kernel, which torch 2.9.1's counter
skips (0 FLOPs), so keep the config's dropout here), divided by the median step time, over the median GFLOP/s of a 2048 x 2048
fp32 matmul measured in the same process with the same thread count. A
``torch.profiler`` table of the top ops (self CPU time per step) shows where the time
goes when the utilisation target (40% for minilm) is missed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    BENCHMARKS,
    NOISY,
    MatmulPeak,
    command_line,
    device_sync,
    generate_data,
    interleaved,
    machine,
    median,
    publish,
    section,
    table,
)

DAY = dt.date(2026, 1, 1)
#: Steps per timed chunk and warm-up steps, per model config (minilm: ~1-3 s a step).
CHUNK = {"tiny": 20, "minilm": 3}
WARMUP = {"tiny": 5, "minilm": 2}
TARGET_UTILISATION = {"minilm": 0.40}
#: Ops whose FLOPs FlopCounterMode counts: the "useful" matmul work.
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul")


@dataclass
class Trainer:
    """One model being trained by the train job's loop; :meth:`steps` runs a chunk."""

    name: str
    run: Callable[[int, int], None]
    batch_size: int
    compiles: Callable[[], int]
    done: int = 0
    sync: Callable[[], None] = lambda: None

    def steps(self, n: int) -> float:
        """Run ``n`` more steps; returns their wall seconds (the device's queue drained)."""
        self.sync()
        started = time.perf_counter()
        self.run(self.done, self.done + n)
        self.sync()
        self.done += n
        return time.perf_counter() - started


def build_trainer(
    model_name: str,
    root: str,
    variant: str,
    max_total: int,
    backend_name: str = "cpu",
    batch_size: int | None = None,
    max_length: int | None = None,
) -> Trainer:
    """The train job's model, optimizer, schedule and data for ``model_name``, stepped
    by :meth:`embedfresh.ml.training.Trainer.run` on ``backend_name`` (its autocast:
    bf16 on cuda). ``variant``: ``eager`` or ``compiled``; ``batch_size`` and
    ``max_length`` (the padded length of every sequence): the model config's unless
    given."""
    from embedfresh.core.config import TrainConfig
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml import training
    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.checkpoint import CheckpointManager
    from embedfresh.ml.data.reader import read_train
    from embedfresh.ml.data.schema import DEMO_FEATURES
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec, tokenizer_file
    from embedfresh.ml.model.tokenizer import TextTokenizer

    settings: dict[str, Any] = dict(
        artifact_root=root,
        model=model_name,
        run_id=f"bench-{model_name}-{variant}",
        data_interval_start=DAY,
        epochs=1000,
        checkpoint_every=10**9,
        log_every=10**9,
        init="base",
    )
    cfg = TrainConfig(**settings)
    store = ArtifactStore(root)
    spec = get_spec(model_name).model_copy(update={"features": DEMO_FEATURES})
    backend = get_backend(backend_name)
    examples = read_train(store, cfg.dataset, DAY, cfg.interval_end, DEMO_FEATURES)
    batch_size = batch_size or spec.default_batch_size
    if len(examples) < batch_size:
        raise SystemExit(f"{len(examples)} training rows do not fill one batch of {batch_size}")
    per_epoch = len(examples) // batch_size
    plan = training.TrainPlan(batch_size, 1, per_epoch, max_total, "bench")
    tokenizer = TextTokenizer(tokenizer_file(), max_length or spec.max_length)
    data = training.TrainingSet.build(examples, tokenizer)
    model = versions.build_model(spec, cfg.seed).to(backend.device)
    init = {"source": "base", "weights": versions.load_base_weights(model)}
    optimizer = training.make_optimizer(model, cfg, incremental=False)
    schedule = training.make_schedule(optimizer, cfg.warmup_steps, max_total)
    manager = CheckpointManager(
        store, model_name, cfg.run_id, cfg.keep_last, plan.config_hash, cfg.checkpoint_every
    )
    forward = model.score_and_embed
    if variant == "compiled":  # as the train job does with compile=on
        forward = backend.compile(forward)
    trainer = training.Trainer(
        cfg, backend, model, forward, optimizer, schedule, data, plan, manager
    )
    state = training.TrainState(plan.per_epoch, plan.samples_per_step, init)

    def run(first: int, last: int) -> None:
        if state.step != first:  # chunks run back to back on one state
            raise RuntimeError(f"chunk starts at step {first}, the state is at {state.step}")
        trainer.run(state, until=last)

    return Trainer(variant, run, batch_size, backend.compiles, sync=device_sync(backend_name))


def count_step_flops(trainer: Trainer) -> int:
    """FLOPs of one training step, counted by FlopCounterMode while it runs."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        trainer.steps(1)
    return counter.get_total_flops()


def profile_steps(trainer: Trainer, steps: int, top: int = 12) -> tuple[list[list[Any]], float]:
    """Top ops by self CPU time over ``steps`` steps: rows of (op, ms/step, share, calls
    per step), and the share of all self time spent in matmul ops."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.steps(steps)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [
        [
            e.key,
            f"{e.self_cpu_time_total / 1000 / steps:.1f}",
            f"{e.self_cpu_time_total / total:.1%}",
            f"{e.count / steps:.0f}",
        ]
        for e in events[:top]
    ]
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    return rows, matmul / total


#: AdamW implementations probed (keyword arguments of torch.optim.AdamW).
ADAMW = {
    "for-loop": {"foreach": False},  # what the train job gets on CPU by default
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def adamw_probe(model_name: str, rounds: int, steps: int = 5) -> dict[str, float]:
    """Milliseconds per AdamW step on the model's parameters (random gradients) for each
    implementation in :data:`ADAMW`, interleaved, medians: the optimizer's share of a
    training step is memory-bound elementwise work, and on CPU torch picks the per-tensor
    for-loop unless told otherwise."""
    import torch

    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    def probe(kwargs: dict[str, bool]) -> Callable[[], float]:
        model = versions.build_model(get_spec(model_name), 0)
        for param in model.parameters():
            param.grad = torch.randn_like(param)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, **kwargs)
        optimizer.step()  # state initialised outside the timing

        def run() -> float:
            started = time.perf_counter()
            for _ in range(steps):
                optimizer.step()
            return (time.perf_counter() - started) / steps * 1000

        return run

    measured = interleaved({k: probe(v) for k, v in ADAMW.items()}, rounds)
    return {k: median(v) for k, v in measured.items()}


def bench_model(
    model_name: str, root: str, variants: list[str], rounds: int, profile_top: int
) -> dict[str, Any]:
    """Every variant of one model config, interleaved round by round with the matmul
    peak, so utilisation is a ratio of figures taken side by side."""
    chunk, warmup = CHUNK[model_name], WARMUP[model_name]
    total = warmup + chunk * (rounds + 1) + 10
    trainers = {v: build_trainer(model_name, root, v, total) for v in variants}
    first_steps, warm_compiles, notes = {}, {}, []
    for v, t in list(trainers.items()):  # the first step traces/compiles: timed apart
        first_steps[v] = t.steps(1)
        t.steps(warmup - 1)
        warm_compiles[v] = t.compiles()
        if v == "compiled" and t.compiles() == 0:
            notes.append(
                f"{model_name}: `compile=on` compiled no graph through `embedfresh.ml.training.Trainer.run` "
                "in this checkout: compiled variant dropped"
            )
            del trainers[v]
    peak = MatmulPeak()
    measured = {v: (lambda t=t: t.steps(chunk)) for v, t in trainers.items()}
    seconds = interleaved({**measured, "peak": peak}, rounds)
    peaks = seconds.pop("peak")
    eager = trainers["eager"]
    flops = count_step_flops(eager)
    out = {
        "variants": list(trainers),
        "notes": notes,
        "chunk": chunk,
        "batch_size": eager.batch_size,
        "first_step_s": {v: round(s, 2) for v, s in first_steps.items()},
        "seconds": {v: [round(s, 3) for s in ss] for v, ss in seconds.items()},
        "samples_per_s": {v: chunk * eager.batch_size / median(ss) for v, ss in seconds.items()},
        "step_s": {v: median(ss) / chunk for v, ss in seconds.items()},
        "compiles_after_warmup": {v: t.compiles() - warm_compiles[v] for v, t in trainers.items()},
        "flops_per_step": flops,
        "peak_gflops": median(peaks),
        "peaks": [round(x, 1) for x in peaks],
    }
    out["profile"], out["matmul_share"] = profile_steps(eager, chunk, profile_top)
    out["adamw_ms"] = adamw_probe(model_name, rounds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,minilm")
    parser.add_argument(
        "--variants",
        default=None,
        help="eager,compiled (default: both where the train job has a compile setting)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds")
    parser.add_argument("--rows", type=int, default=2048, help="generated training rows")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--profile-top", type=int, default=12)
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()

    import torch

    from embedfresh.ml.backends.base import Backend

    torch.set_num_threads(args.threads)
    has_compile = hasattr(Backend, "compile")  # the train job's compile=on path
    variants = (args.variants or ("eager,compiled" if has_compile else "eager")).split(",")
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        # A fresh inductor cache: the compiled variant's first step is a cold compile.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")
        root = f"file://{Path(tmp).resolve()}"
        generate_data(root, DAY, args.rows)
        for name in args.models.split(","):
            print(f"benchmarking {name} ({', '.join(variants)}) ...", flush=True)
            results[name] = bench_model(name, root, variants, args.rounds, args.profile_top)

    rows = []
    for name, r in results.items():
        eager_rate = r["samples_per_s"]["eager"]
        for v in r["variants"]:
            achieved = r["flops_per_step"] / r["step_s"][v] / 1e9
            rows.append(
                [
                    name,
                    v,
                    f"{r['samples_per_s'][v]:.1f}",
                    f"{r['samples_per_s'][v] / eager_rate:.2f}x",
                    f"{r['step_s'][v] * 1000:.0f}",
                    f"{r['first_step_s'][v]:.1f}",
                    r["compiles_after_warmup"][v],
                    f"{r['flops_per_step'] / 1e9:.2f}",
                    f"{achieved:.1f}",
                    f"{r['peak_gflops']:.1f}",
                    f"{achieved / r['peak_gflops']:.0%}",
                ]
            )
    headers = [
        "config",
        "mode",
        "samples/s (median)",
        "vs eager",
        "ms/step",
        "first step s",
        "compiles after warm-up",
        "GFLOP/step",
        "GFLOP/s",
        "matmul peak GFLOP/s",
        "utilisation",
    ]
    bullets = [
        f"Command: `{command_line()}`",
        f"Machine: {machine()}; {args.threads} torch threads",
        f"Date: {dt.datetime.now(dt.UTC).isoformat(timespec='minutes')}; {NOISY}",
        "Drives the train job's step loop (`embedfresh.ml.training.Trainer.run`) in chunks on the job's own "
        "model, AdamW, LR schedule and fixed batch shapes (batch 32; padded length 32 tiny, "
        "64 minilm); a sample is one (query, product) pair, two encoder sequences",
        f"Rounds: {args.rounds}, chunks of {', '.join(f'{m} {CHUNK[m]}' for m in results)} "
        "steps after warm-up, variants interleaved; timings per chunk (s): "
        + "; ".join(f"{m} {v} {ss}" for m, r in results.items() for v, ss in r["seconds"].items()),
        "Peak: a 2048x2048 fp32 matmul timed once per round between the training chunks "
        "(per round: "
        + "; ".join(f"{m} {r['peaks']}" for m, r in results.items())
        + " GFLOP/s), median per config; FLOPs per step counted by FlopCounterMode "
        "(forward + backward matmuls and attention; elementwise ops and AdamW count 0)",
    ]
    bullets += [n for r in results.values() for n in r["notes"]]
    if not has_compile:
        bullets.append(
            "torch.compile: not measured, this checkout's train job has no `compile` "
            "setting yet (eager only)"
        )
    for name, target in TARGET_UTILISATION.items():
        if name in results:
            r = results[name]
            achieved = r["flops_per_step"] / r["step_s"]["eager"] / 1e9 / r["peak_gflops"]
            verdict = "met" if achieved >= target else "missed"
            bullets.append(
                f"Target {name} utilisation >= {target:.0%}: {verdict} ({achieved:.0%} eager)"
            )
    bullets.append(f"Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s")
    body = [table(headers, rows, right=2)]
    for name, r in results.items():
        body.append(
            f"Where the time goes, {name} eager (torch.profiler, self CPU time per step "
            f"over {r['chunk']} steps; matmul ops {r['matmul_share']:.0%} of it):"
        )
        body.append(table(["op", "ms/step", "share", "calls/step"], r["profile"]))
    adamw_rows = [
        [name, *(f"{r['adamw_ms'][k]:.1f}" for k in ADAMW), f"{r['step_s']['eager'] * 1000:.0f}"]
        for name, r in results.items()
    ]
    body.append(
        "AdamW alone, ms per optimizer step on the model's parameters (random gradients; "
        "interleaved, medians), next to the whole eager training step. The train job's "
        "`torch.optim.AdamW(...)` without `foreach`/`fused` runs the for-loop on CPU:"
    )
    body.append(table(["config", *(f"AdamW {k} ms" for k in ADAMW), "eager step ms"], adamw_rows))
    publish(
        section("Training throughput and utilisation (CPU)", bullets, body),
        None if args.no_append else BENCHMARKS,
    )


if __name__ == "__main__":
    main()
