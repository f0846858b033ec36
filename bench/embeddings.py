"""Embedding throughput: our embed path against ``SentenceTransformer.encode`` (minilm).

Run on demand, not in CI::

    OMP_NUM_THREADS=2 .venv/bin/python bench/embeddings.py [--texts 10000] [--repeats 3]

One invocation runs every variant in its own subprocess on the same texts with the same
thread count (so each peak RSS is that variant's own): ``st`` (the shipped
all-MiniLM-L6-v2 through sentence-transformers, batch size swept over 8/16/32/64/128 on a
subset in the first round, the best one timed on all texts), ``ours-fp32``,
``ours-int8`` and ``ours-bf16`` (length bucketing + the unpadded forward of
:mod:`embedfresh.ml.embedding.packed`, as the embed job runs it, in memory, no store) and
``ours-fp32-padded`` (the same buckets through the padded ``model.embed``: what packing
adds), ``ours-fp32-compiled`` (the embed job's ``compile=true``: the padded forward under
torch.compile, static batches in the job's default buckets; its first pass compiles and is
timed apart). Both sides truncate at 256 tokens (the shipped model's
``max_seq_length``). The variants are interleaved: each round runs every variant once
(one untimed warm-up batch, then one timed pass over all texts), so load from other
work on a shared machine hits all of them alike; the median over rounds is reported.
Last subprocesses run the embed job's fast-mode quality gates, bf16 and int8
(:func:`embedfresh.ml.embedding.precision.fast_mode_gate`, one-sided non-inferiority at 95% on
recall@10) on a generated eval split of ``--gate-eval-rows`` rows (``--gate-only`` runs
just that) with the embed job's defaults. Prints a Markdown table and appends it with the
command, machine (CPU model, the vector ISA torch dispatches to and AMX / AVX512-BF16 /
VNNI: fp32 GEMM rates differ by about 2x between AVX2 and AVX-512 parts, bf16 and int8
ones by about 5x with and without AMX) and date to ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TIMED = ("st", "ours-fp32", "ours-fp32-padded", "ours-fp32-compiled", "ours-int8", "ours-bf16")
FAST_MODES = ("bf16", "int8")
MAX_LENGTH = 256
ST_BATCH_SIZES = (8, 16, 32, 64, 128)  # 16 was the best on an AVX-512 EPYC (2026-11-27)
SWEEP_TEXTS = 1000
# Ours, tuned for eager CPU: many lengths (little padding), no dummy rows.
LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
TOKEN_BUDGET = 4096

LONG_TEXTS = [
    "Das ist ein schöner Tag in München, die Straße ist ruhig und die Geschäfte sind offen.",
    "Café crème à emporter, s'il vous plaît. Où est la gare la plus proche de l'hôtel ?",
    "无线蓝牙耳机 主动降噪 长续航 适用于跑步和通勤 支持快速充电",
    "Zapatillas de running para hombre, impermeables, talla 44, suela de goma antideslizante.",
    "Беспроводные наушники с шумоподавлением и длительным временем работы от батареи.",
    "防水ハイキングブーツ、レザー、サイズ27センチ、軽量で歩きやすい",
]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Product corpus texts plus ~10% longer and non-English ones, shuffled."""
    from embedfresh.ml.data.generate import generate_corpus

    rng = np.random.default_rng(seed)
    n_other = n // 10  # half non-English, half long (30-150 words)
    texts = generate_corpus(seed, n - n_other).column("text").to_pylist()
    for i in range(n_other):
        if i % 2:
            texts.append(LONG_TEXTS[i % len(LONG_TEXTS)])
        else:  # long descriptions
            words = int(rng.integers(30, 150))
            pool = " ".join(texts[j] for j in rng.integers(0, n - n_other, size=words // 5 + 1))
            texts.append(" ".join(pool.split()[:words]))
    order = rng.permutation(len(texts))
    return [texts[i] for i in order]


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _time(fn, repeats: int) -> tuple[float, np.ndarray, list[float]]:
    seconds, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), out, seconds


def run_variant(
    variant: str, texts: list[str], repeats: int, batch_size: int | None = None
) -> dict:
    import torch

    threads = torch.get_num_threads()
    result: dict = {"variant": variant, "threads": threads, "texts": len(texts)}
    if variant == "st":
        os.environ["HF_HUB_OFFLINE"] = "1"
        from sentence_transformers import SentenceTransformer

        from embedfresh.ml.model.presets import minilm_dir

        st = SentenceTransformer(str(minilm_dir()), device="cpu")
        st.max_seq_length = MAX_LENGTH
        st.encode(texts[:64], batch_size=64)  # warm-up
        sweep = {}
        subset = texts[:SWEEP_TEXTS]
        for bs in ST_BATCH_SIZES if batch_size is None else ():
            t0 = time.perf_counter()
            st.encode(subset, batch_size=bs, convert_to_numpy=True)
            sweep[bs] = len(subset) / (time.perf_counter() - t0)
        best = max(sweep, key=sweep.get) if batch_size is None else batch_size
        median, vectors, all_s = _time(
            lambda: st.encode(texts, batch_size=best, convert_to_numpy=True), repeats
        )
        result.update(batch_size=best, sweep={str(k): round(v, 1) for k, v in sweep.items()})
    else:
        from embedfresh.ml.backends import get_backend
        from embedfresh.ml.embedding.bucketing import VariableTokenizer
        from embedfresh.ml.embedding.encode import embed_texts
        from embedfresh.ml.model import versions
        from embedfresh.ml.model.presets import get_spec, tokenizer_file

        spec = get_spec("minilm")
        model = versions.build_model(spec, 0)
        versions.load_base_weights(model)
        model.eval()
        backend = get_backend("cpu")
        tok = VariableTokenizer(tokenizer_file().read_bytes(), MAX_LENGTH)
        if variant == "ours-int8":  # calibrated on the first texts, as the embed job does
            from embedfresh.ml.embedding.precision import quantize_int8

            model, _ = quantize_int8(model, backend, tok(texts[:512])[0])
        elif variant == "ours-bf16":
            from embedfresh.ml.embedding.precision import to_bf16

            model, _ = to_bf16(model, backend)
        hidden = spec.encoder.hidden_size

        packed = variant != "ours-fp32-padded"
        lengths, static, forward = LENGTHS, False, None
        if variant == "ours-fp32-compiled":  # the embed job's compile=true: its buckets
            from embedfresh.core.config.embedding import DEFAULT_LENGTHS

            lengths = tuple(n for n in DEFAULT_LENGTHS if n <= MAX_LENGTH)
            static, forward = True, backend.compile(model.embed)

        def run() -> np.ndarray:  # tokenisation included, as sentence-transformers does
            return embed_texts(
                model, backend, tok, texts, lengths, TOKEN_BUDGET, hidden, static, packed, forward
            )

        # Warm-up: a compiled forward compiles (or loads from inductor's cache) a graph per
        # bucket on its first pass over all texts, timed apart.
        t0 = time.perf_counter()
        if forward is not None:
            run()
        else:
            embed_texts(
                model, backend, tok, texts[:64], lengths, TOKEN_BUDGET, hidden, static, packed
            )
        result["warm_up_s"] = round(time.perf_counter() - t0, 3)
        median, vectors, all_s = _time(run, repeats)
        result.update(lengths=list(lengths), token_budget=TOKEN_BUDGET, packed=packed)
    result.update(
        seconds=[round(s, 3) for s in all_s],
        sentences_per_s=len(texts) / median,
        peak_rss_mib=_peak_rss_mib(),
    )
    return result, np.asarray(vectors, dtype=np.float32)


def run_gate(workdir: Path, eval_rows: int, mode: str) -> dict:
    """The embed job's quality gate of fast ``mode`` (int8/bf16) with its defaults, on a
    generated eval split of ``eval_rows`` rows (about one query per 8 rows)."""
    from embedfresh.core import layout
    from embedfresh.core.config import EmbedConfig
    from embedfresh.core.config.embedding import DEFAULT_LENGTHS
    from embedfresh.core.shards import read_corpus_shard
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.data.generate import write_dataset
    from embedfresh.ml.embedding.bucketing import VariableTokenizer, padded_lengths
    from embedfresh.ml.embedding.precision import fast_mode_gate, quantize_int8, to_bf16
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec, tokenizer_file

    store = ArtifactStore(f"file://{workdir / 'store'}")
    write_dataset(store, "products", 0, dt.date(2026, 1, 1), 1, 64, eval_rows, "products", 512, 512)
    spec = get_spec("minilm")
    model = versions.build_model(spec, 0)
    versions.load_base_weights(model)
    model.eval()
    backend = get_backend("cpu")
    max_length = spec.embedding_max_length
    tok = VariableTokenizer(tokenizer_file().read_bytes(), max_length)
    budget = EmbedConfig.model_fields["token_budget"].default
    t0 = time.perf_counter()
    extra: dict = {}
    if mode == "int8":
        # Calibrated as the embed job calibrates: the first texts of the corpus's first shard.
        path = f"{layout.corpus('products')}/{layout.part_name(0)}"
        _, texts = read_corpus_shard(store, path)
        fast, layers = quantize_int8(
            model, backend, tok([spec.prompt("document") + t for t in texts])[0]
        )
        extra = {
            "quantization": {k: v for k, v in layers.items() if k != "layers"},
            "worst_layer_error": max(e["relative_error"] for e in layers["layers"]),
        }
    else:
        fast, extra = to_bf16(model, backend)
    result, summary = fast_mode_gate(
        store,
        "products",
        model,
        fast,
        backend,
        tok,
        padded_lengths(DEFAULT_LENGTHS, max_length),
        budget,
        mode=mode,
    )
    m = result.metric("recall_at_10")
    return {
        **extra,
        "mode": mode,
        "eval_rows": eval_rows,
        "seconds": round(time.perf_counter() - t0, 1),
        "n_products": summary["n_products"],
        "d": m.bootstrap.d if m.bootstrap else None,
        "confidence": result.confidence,
        "n_needed": result.n_needed,
        "verdict": str(result.verdict),
        "reason": result.reason,
        "max_length": max_length,
        "n_queries": summary["n_queries"],
        "recall_fp32": summary["recall_at_10_fp32"],
        "recall_fast": summary[f"recall_at_10_{mode}"],
        "ci": [m.bootstrap.ci_low, m.bootstrap.ci_high] if m.bootstrap else None,
    }


def _child(args: argparse.Namespace) -> None:
    work = Path(args.workdir)
    if args.variant.startswith("gate-"):
        out = run_gate(work, args.gate_eval_rows, args.variant.removeprefix("gate-"))
    else:
        texts = json.loads((work / "texts.json").read_text())
        out, vectors = run_variant(args.variant, texts, args.repeats, args.batch_size)
        np.save(work / f"{args.variant}.npy", vectors)
    (work / f"{args.variant}.json").write_text(json.dumps(out))


def _machine() -> str:
    from _common import cpu_isa, cpu_model

    return (
        f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}, torch "
        f"dispatches to {cpu_isa()}, Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--output", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument(
        "--gate-eval-rows",
        type=int,
        default=40_000,
        help="eval rows generated for the fast modes' quality gate (about one query per 8 "
        "rows; 0: no gate)",
    )
    parser.add_argument(
        "--gate-modes",
        default=",".join(FAST_MODES),
        help="the fast modes whose gate runs, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--gate-only", action="store_true", help="run only the gates")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        _child(args)
        return

    started = time.perf_counter()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "true",
        "PYTHONPATH": str(ROOT),
    }
    modes = [m for m in args.gate_modes.split(",") if m] if args.gate_eval_rows else []
    if args.gate_only:
        with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
            gates = {m: _run_gate(tmp, env, args.gate_eval_rows, m) for m in modes}
        cmd = (
            f"OMP_NUM_THREADS={args.threads} .venv/bin/python bench/embeddings.py --gate-only "
            f"--gate-eval-rows {args.gate_eval_rows} --gate-modes {args.gate_modes}"
        )
        text = "\n".join(
            [
                f"## Fast modes' quality gate on minilm ({dt.date.today().isoformat()})",
                "",
                f"- Command: `{cmd}`",
                f"- Machine: {_machine()}; {args.threads} torch threads",
                *(_gate_line(g) for g in gates.values()),
                f"- Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s",
                "",
            ]
        )
        _emit(args, text)
        return

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        work = Path(tmp)
        texts = make_texts(args.texts)
        (work / "texts.json").write_text(json.dumps(texts))
        for r in range(args.repeats):
            for variant in TIMED:
                print(f"round {r + 1}: {variant} ...", file=sys.stderr, flush=True)
                cmd = [sys.executable, __file__, "--variant", variant, "--workdir", tmp]
                cmd += ["--repeats", "1"]
                if variant == "st" and r:
                    cmd += ["--batch-size", str(results["st"]["batch_size"])]
                subprocess.run(cmd, env=env, check=True)
                out = json.loads((work / f"{variant}.json").read_text())
                if r:  # later rounds add their timing and peak to the first round's
                    first = results[variant]
                    first["seconds"] += out["seconds"]
                    first["peak_rss_mib"] = max(first["peak_rss_mib"], out["peak_rss_mib"])
                else:
                    results[variant] = out
        for out in (results[v] for v in TIMED):
            out["sentences_per_s"] = out["texts"] / statistics.median(out["seconds"])
        gates = {m: _run_gate(tmp, env, args.gate_eval_rows, m) for m in modes}
        st_vec = np.load(work / "st.npy")
        for variant in TIMED[1:]:
            v = np.load(work / f"{variant}.npy")
            cos = (v * st_vec).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(st_vec, axis=1)
            results[variant]["max_abs_1_minus_cos"] = float(np.abs(1 - cos).max())
    results["st"]["max_abs_1_minus_cos"] = 0.0

    st_rate = results["st"]["sentences_per_s"]

    def verdict(mode: str) -> str:
        return f"{mode} gate: {gates[mode]['verdict']}" if mode in gates else f"{mode} gate not run"

    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.embedding.packed import onednn_is_faster
    from embedfresh.ml.embedding.precision import native_bf16

    gemm = "oneDNN" if onednn_is_faster() else "MKL"  # the packed forward's GEMMs

    bf16 = "native bf16" if native_bf16(get_backend("cpu")) else "bf16 emulated"
    rows = [
        ("sentence-transformers fp32", results["st"], f"batch {results['st']['batch_size']}"),
        ("ours fp32", results["ours-fp32"], f"bucketed, budget 4096, packed, {gemm}"),
        ("ours fp32, padded", results["ours-fp32-padded"], "same buckets, padded"),
        (
            "ours fp32, compiled (compile=true)",
            results["ours-fp32-compiled"],
            "torch.compile, static batches in the embed job's buckets; first pass "
            f"{results['ours-fp32-compiled']['warm_up_s']:.0f} s (compiles, or loads "
            "inductor's cache in later rounds)",
        ),
        ("ours int8 (dynamic, calibrated)", results["ours-int8"], verdict("int8")),
        ("ours bf16", results["ours-bf16"], f"packed, {bf16}; {verdict('bf16')}"),
    ]
    lines = [
        f"| variant | sentences/s (median of {args.repeats}) | vs ST | max abs(1 - cos) vs ST "
        "| peak RSS MiB | notes |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, r, note in rows:
        lines.append(
            f"| {name} | {r['sentences_per_s']:.1f} | {r['sentences_per_s'] / st_rate:.2f}x | "
            f"{r['max_abs_1_minus_cos']:.2e} | {r['peak_rss_mib']:.0f} | {note} |"
        )
    sweep = ", ".join(f"{k}: {v}" for k, v in results["st"]["sweep"].items())
    cmd = (
        f"OMP_NUM_THREADS={args.threads} .venv/bin/python bench/embeddings.py --texts "
        f"{args.texts} --repeats {args.repeats} --gate-eval-rows {args.gate_eval_rows}"
        + (f" --gate-modes {args.gate_modes}" if args.gate_eval_rows else "")
    )
    text = "\n".join(
        [
            f"## Embeddings: ours vs sentence-transformers ({dt.date.today().isoformat()})",
            "",
            f"- Command: `{cmd}`",
            f"- Machine: {_machine()}; {results['st']['threads']} torch threads in every variant",
            f"- {args.texts} texts (product corpus + 10% long / non-English), max length "
            f"{MAX_LENGTH} on both sides; each variant in its own process (peak RSS = ru_maxrss)",
            f"- {args.repeats} interleaved rounds (every variant once a round, fresh process); "
            "timings per round (s): " + "; ".join(f"{k} {results[k]['seconds']}" for k in TIMED),
            f"- Load average (1, 5, 15 min) at the end: {os.getloadavg()}",
            f"- ST batch-size sweep on {SWEEP_TEXTS} texts (sentences/s): {sweep}",
            f"- Ours: lengths {list(LENGTHS)}, token budget {TOKEN_BUDGET}, no dummy rows",
            *(_gate_line(g) for g in gates.values()),
            *([] if gates else ["- Fast modes' quality gate: not run (--gate-eval-rows 0)"]),
            "- Targets (issue 18): fp32 >= 2.0x ST with every vector within cosine 0.99999; "
            "a fast mode >= 4x ST whose quality gate PASSes",
            f"- Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s",
            "",
            *lines,
            "",
        ]
    )
    _emit(args, text)


def _run_gate(tmp: str, env: dict[str, str], eval_rows: int, mode: str) -> dict:
    print(f"{mode} quality gate on {eval_rows} eval rows ...", file=sys.stderr, flush=True)
    cmd = [sys.executable, __file__, "--variant", f"gate-{mode}", "--workdir", tmp]
    subprocess.run([*cmd, "--gate-eval-rows", str(eval_rows)], env=env, check=True)
    return json.loads((Path(tmp) / f"gate-{mode}.json").read_text())


def _gate_line(gate: dict) -> str:
    lo, hi = gate["ci"] or (float("nan"), float("nan"))
    mode = gate["mode"]
    if mode == "int8":
        how = (
            f"calibration {gate['quantization']['calibration_texts']} corpus texts "
            f"({gate['quantization']['calibration_tokens']} tokens), "
            f"{gate['quantization']['int8_layers']} layers int8, fp32 kept: "
            f"{gate['quantization']['fp32_layers'] or 'none'}, worst layer error "
            f"{gate['worst_layer_error']}"
        )
    else:
        how = "native bf16" if gate["native_bf16"] else "bf16 emulated (no AMX / AVX512-BF16)"
    return (
        f"- {mode} quality gate (embed job defaults, max length {gate['max_length']}, "
        f"{gate['eval_rows']:,} eval rows: {gate['n_queries']:,} queries over "
        f"{gate['n_products']:,} products, {gate['seconds']} s): **{gate['verdict']}**, "
        f"recall@10 fp32 {gate['recall_fp32']} vs {mode} {gate['recall_fast']}, d = "
        f"{gate['d']:+.4%}, one-sided 95% lower bound {lo:+.4%} (90% interval [{lo:+.4%}, "
        f"{hi:+.4%}]) against -0.1%; n_needed {gate['n_needed']}; {how}"
    )


def _emit(args: argparse.Namespace, text: str) -> None:
    print(text)
    if not args.no_append:
        out = Path(args.output)
        head = "" if out.exists() else "# Benchmarks\n\n"
        with out.open("a") as f:
            f.write(head + text + "\n")


if __name__ == "__main__":
    main()
