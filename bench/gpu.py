"""GPU figures (issue 18, goal 6) in one command, on any machine with an NVIDIA GPU::

    .venv/bin/python bench/gpu.py [--texts 20000] [--no-append]

Three parts, each on the same GPU in one process (``--parts`` picks), every figure
recorded with the device's name:

1. **embed**: our embed path (:func:`embedfresh.ml.embedding.encode.embed_texts`, length
   buckets, the unpadded forward, the cuda backend's bf16 autocast: what the embed job
   runs) against ``SentenceTransformer.encode`` in fp16 (``model.half()``, its batch size
   swept), on the benchmark's texts (``bench/embeddings.py``'s mix, truncation at 256).
   Tokenisation is timed on both sides; variants are interleaved, medians of
   ``--repeats``. Every vector's cosine is taken against sentence-transformers in fp32
   on the same GPU (goal: ours >= 1.3x its fp16, cosine >= 0.9999).
2. **train**: the train job's step loop (``bench/train_throughput.py``'s
   ``build_trainer``: model, AdamW, schedule and data of the job) on the cuda backend,
   bf16 autocast, minilm, at the CPU recipe's batch and at a batch that fills the GPU
   (``--fill-batch`` x ``--fill-length``, default 256 x 128). FLOPs per step counted by
   ``FlopCounterMode``; utilisation = achieved FLOP/s over a bf16 ``n x n`` matmul timed
   between the same rounds (goal: >= 40% at the filling batch).
3. **compile**: ``bench/compile.py``'s cold/warm run through the real train and compile
   jobs with ``backend=cuda`` (goal: warm first step <= 10% of cold).

Without a CUDA device it exits 2 and says so. ``--device cpu --quick`` runs the same code
on the CPU at toy sizes (the test suite does, so the bench cannot rot); its figures mean
nothing and it never appends to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    BENCHMARKS,
    NOISY,
    MatmulPeak,
    bench_env,
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
from train_throughput import DAY, build_trainer, count_step_flops

TARGET_EMBED = 1.3
TARGET_COSINE = 0.9999
TARGET_UTILISATION = 0.40
TARGET_WARM_COLD = 0.10
ST_BATCH_SIZES = (32, 64, 128, 256, 512)


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return f"CPU ({torch.backends.cpu.get_cpu_capability()})"


def bench_embed(
    device: str,
    texts: list[str],
    repeats: int,
    batch_sizes: tuple[int, ...],
    compiled: bool = True,
) -> dict[str, Any]:
    """Ours (the embed job's path) against sentence-transformers fp16 on ``device``, both
    with the shipped all-MiniLM-L6-v2. ``compiled``: also the embed job's ``compile=true``
    forward (torch.compile, static batches in the job's default buckets) under the cuda
    backend's bf16 autocast, and the same on an fp16 copy of the model."""
    import embeddings  # bench/embeddings.py: its texts, lengths and token budget
    from sentence_transformers import SentenceTransformer

    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.embedding.bucketing import VariableTokenizer
    from embedfresh.ml.embedding.encode import embed_texts
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec, minilm_dir, tokenizer_file

    sync = device_sync(device)
    st32 = SentenceTransformer(str(minilm_dir()), device=device)
    st32.max_seq_length = embeddings.MAX_LENGTH
    reference = st32.encode(texts, batch_size=64, convert_to_numpy=True)
    st16 = SentenceTransformer(str(minilm_dir()), device=device)
    st16.max_seq_length = embeddings.MAX_LENGTH
    if device.startswith("cuda"):
        st16.half()  # what sentence-transformers' docs measure as "fp16"
    sweep = {}
    subset = texts[: max(len(texts) // 5, 64)]
    for bs in batch_sizes:
        st16.encode(subset[:bs], batch_size=bs)  # warm-up at this shape
        sync()
        started = time.perf_counter()
        st16.encode(subset, batch_size=bs, convert_to_numpy=True)
        sync()
        sweep[bs] = len(subset) / (time.perf_counter() - started)
    best = max(sweep, key=sweep.get)

    spec = get_spec("minilm")
    ours_model = versions.build_model(spec, 0)
    versions.load_base_weights(ours_model)
    backend = get_backend("cuda" if device.startswith("cuda") else "cpu")
    ours_model = ours_model.to(backend.device).eval()
    tok = VariableTokenizer(tokenizer_file().read_bytes(), embeddings.MAX_LENGTH)
    hidden = spec.encoder.hidden_size
    budget = embeddings.TOKEN_BUDGET * 4 if device.startswith("cuda") else embeddings.TOKEN_BUDGET
    outputs: dict[str, np.ndarray] = {}

    def ours() -> float:
        sync()
        started = time.perf_counter()
        outputs["ours"] = embed_texts(
            ours_model, backend, tok, texts, embeddings.LENGTHS, budget, hidden, False, True
        )
        sync()
        return time.perf_counter() - started

    def st_fp16() -> float:
        sync()
        started = time.perf_counter()
        outputs["st16"] = st16.encode(texts, batch_size=best, convert_to_numpy=True)
        sync()
        return time.perf_counter() - started

    variants = {"ours": ours, "st-fp16": st_fp16}
    compile_seconds: dict[str, float] = {}
    if compiled:
        import copy

        import torch

        from embedfresh.core.config.embedding import DEFAULT_LENGTHS

        buckets = tuple(n for n in DEFAULT_LENGTHS if n <= embeddings.MAX_LENGTH)
        kind = backend.device.type
        bf16 = backend.compile(ours_model.embed)
        half = torch.compile(copy.deepcopy(ours_model).half().embed, dynamic=False)

        def fp16(ids: Any, mask: Any) -> Any:
            with torch.autocast(kind, enabled=False):  # the fp16 weights as they are
                return half(ids, mask)

        def timed(name: str, forward: Any) -> Any:
            def run() -> float:
                sync()
                started = time.perf_counter()
                outputs[name] = embed_texts(
                    ours_model, backend, tok, texts, buckets, budget, hidden, True, forward=forward
                )
                sync()
                return time.perf_counter() - started

            return run

        for name, forward in (("compiled-bf16", bf16), ("compiled-fp16", fp16)):
            variants[name] = timed(name, forward)
            compile_seconds[name] = variants[name]()  # the cold compile of every bucket
    embed_texts(ours_model, backend, tok, texts[:256], embeddings.LENGTHS, budget, hidden)
    seconds = interleaved(variants, repeats)

    def cosines(vectors: np.ndarray) -> np.ndarray:
        a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
        return (a * b).sum(1)

    rates = {k: len(texts) / median(v) for k, v in seconds.items()}
    return {
        "texts": len(texts),
        "st_batch": best,
        "sweep": {str(k): round(v, 1) for k, v in sweep.items()},
        "seconds": {k: [round(s, 3) for s in v] for k, v in seconds.items()},
        "rates": rates,
        "speedup": rates["ours"] / rates["st-fp16"],
        "min_cos": {
            **{k: float(cosines(v).min()) for k, v in outputs.items() if k != "st16"},
            "st-fp16": float(cosines(outputs["st16"]).min()),
        },
        "compile_seconds": compile_seconds,
        "token_budget": budget,
    }


def bench_train(
    device: str,
    root: str,
    model: str,
    batches: list[tuple[int | None, int | None]],
    rounds: int,
    chunk: int,
    variants: tuple[str, ...] = ("eager",),
) -> list[dict[str, Any]]:
    """Utilisation of the train job's step loop at each (batch, length) in ``batches``
    (None: the model config's own), per variant (``eager``; ``compiled``: the job's
    ``compile=on``), against a matmul peak timed between the rounds. FLOPs per step are
    counted on the eager trainer: the compiled step does the same arithmetic."""
    backend = "cuda" if device.startswith("cuda") else "cpu"
    dtype = "bfloat16" if backend == "cuda" else "float32"
    peak = MatmulPeak(n=8192 if backend == "cuda" else 1024, device=device, dtype=dtype)
    rows = []
    for batch, length in batches:
        total = 3 + chunk * (rounds + 1) + 10
        trainers = {
            v: build_trainer(model, root, v, total, backend, batch, length)
            for v in dict.fromkeys(("eager", *variants))
        }
        first = {v: t.steps(1) for v, t in trainers.items()}  # compiled: the cold compile
        for t in trainers.values():
            t.steps(2)  # warm-up: allocator, kernels picked per shape
        timed = {v: (lambda t=t: t.steps(chunk)) for v, t in trainers.items()}
        seconds = interleaved({**timed, "peak": peak}, rounds)
        flops = count_step_flops(trainers["eager"])
        peak_gflops = median(seconds["peak"])
        for v, t in trainers.items():
            step_s = median(seconds[v]) / chunk
            rows.append(
                {
                    "batch": t.batch_size,
                    "length": length,
                    "variant": v,
                    "first_step_s": first[v],
                    "step_ms": step_s * 1000,
                    "samples_per_s": t.batch_size / step_s,
                    "gflop_per_step": flops / 1e9,
                    "gflops": flops / step_s / 1e9,
                    "peak_gflops": peak_gflops,
                    "peak_dtype": dtype,
                    "utilisation": flops / step_s / 1e9 / peak_gflops,
                }
            )
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", default="embed,train,compile")
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fill-batch", type=int, default=256)
    parser.add_argument("--fill-length", type=int, default=128)
    parser.add_argument(
        "--train-variants", default="eager,compiled", help="eager and/or compiled (compile=on)"
    )
    parser.add_argument("--compile-steps", type=int, default=30)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--quick", action="store_true", help="toy sizes (smoke test)")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.quick:
        args.texts, args.repeats, args.rounds, args.model = 32, 1, 1, "tiny"
        args.fill_batch, args.fill_length, args.compile_steps = 16, 32, 3
        args.train_variants = "eager"  # a cold CPU compile would add a minute

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "bench/gpu.py: no CUDA device is visible (torch.cuda.is_available() is False): "
            "run it on a machine with an NVIDIA GPU; docs/BENCHMARKS.md says where no GPU "
            "figure exists yet",
            file=sys.stderr,
        )
        raise SystemExit(2)

    import embeddings

    started = time.perf_counter()
    name = device_name(args.device)
    bullets = [
        f"Command: `{command_line()}`",
        f"Device: **{name}**; host {machine()}",
    ]
    body: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        root = f"file://{tmp}/store"
        generate_data(root, DAY, max(2048, 4 * args.fill_batch))
        if "embed" in parts:
            texts = embeddings.make_texts(args.texts)
            sizes = ST_BATCH_SIZES[:1] if args.quick else ST_BATCH_SIZES
            e = bench_embed(args.device, texts, args.repeats, sizes, not args.quick)
            bullets.append(
                f"embed: {e['texts']:,} texts, truncation {embeddings.MAX_LENGTH}; "
                f"sentence-transformers fp16 batch sweep (sentences/s) {e['sweep']}, "
                f"best {e['st_batch']}; ours token budget {e['token_budget']}; seconds per "
                f"round {e['seconds']}"
            )
            body += [
                table(
                    ["variant", "sentences/s (median)", "vs ST fp16", "min cosine vs ST fp32"],
                    [
                        [
                            "sentence-transformers fp16",
                            f"{e['rates']['st-fp16']:.0f}",
                            "1.00x",
                            f"{e['min_cos']['st-fp16']:.6f}",
                        ],
                        [
                            "ours (embed job path, bf16 autocast)",
                            f"{e['rates']['ours']:.0f}",
                            f"{e['speedup']:.2f}x",
                            f"{e['min_cos']['ours']:.6f}",
                        ],
                        *(
                            [
                                f"ours {name} (compile=true; cold compile "
                                f"{e['compile_seconds'][name]:.0f} s)",
                                f"{e['rates'][name]:.0f}",
                                f"{e['rates'][name] / e['rates']['st-fp16']:.2f}x",
                                f"{e['min_cos'][name]:.6f}",
                            ]
                            for name in e["compile_seconds"]
                        ),
                    ],
                ),
                f"Goal: ours >= {TARGET_EMBED}x sentence-transformers fp16 with every cosine >= "
                f"{TARGET_COSINE}: "
                + (
                    "met"
                    if e["speedup"] >= TARGET_EMBED and e["min_cos"]["ours"] >= TARGET_COSINE
                    else "missed"
                )
                + ".",
            ]
        if "train" in parts:
            rows = bench_train(
                args.device,
                root,
                args.model,
                [(None, None), (args.fill_batch, args.fill_length)],
                args.rounds,
                2 if args.quick else 10,
                tuple(args.train_variants.split(",")),
            )
            best_fill = max(r["utilisation"] for r in rows if r["length"] == args.fill_length)
            body += [
                table(
                    [
                        "batch x length",
                        "variant",
                        "samples/s",
                        "ms/step",
                        "first step s",
                        "GFLOP/step",
                        "achieved GFLOP/s",
                        "matmul peak GFLOP/s",
                        "utilisation",
                    ],
                    [
                        [
                            f"{r['batch']} x {r['length'] or 'config'}",
                            r["variant"],
                            f"{r['samples_per_s']:.0f}",
                            f"{r['step_ms']:.1f}",
                            f"{r['first_step_s']:.1f}",
                            f"{r['gflop_per_step']:.1f}",
                            f"{r['gflops']:.0f}",
                            f"{r['peak_gflops']:.0f} ({r['peak_dtype']})",
                            f"{r['utilisation']:.0%}",
                        ]
                        for r in rows
                    ],
                ),
                f"Goal: utilisation >= {TARGET_UTILISATION:.0%} at the filling batch: "
                + ("met" if best_fill >= TARGET_UTILISATION else "missed")
                + f" (best variant {best_fill:.0%}); the first rows are the CPU recipe's "
                "batch, launch-bound on a GPU. A compiled row's first step is its cold "
                "compile.",
            ]
        if "compile" in parts:
            import compile as compile_bench

            backend = "cuda" if args.device.startswith("cuda") else "cpu"
            c = compile_bench.bench_model(
                root, args.model, args.compile_steps, Path(tmp), bench_env(1), backend
            )
            ratio = c["warm_first"] / c["cold_first"]
            body += [
                compile_bench.table([c]),
                f"Goal: warm first step <= {TARGET_WARM_COLD:.0%} of cold: "
                + ("met" if ratio <= TARGET_WARM_COLD else "missed")
                + f" ({ratio:.2f}).",
            ]
    bullets.append(f"Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s")
    if not args.device.startswith("cuda"):
        bullets.append(f"Not a GPU run: {NOISY}")
    text = section(f"GPU figures on {name}", bullets, body)
    keep = not args.no_append and not args.quick and args.device.startswith("cuda")
    publish(text, BENCHMARKS if keep else None)


if __name__ == "__main__":
    main()
