"""Embedding throughput: our embed path against ``SentenceTransformer.encode`` (minilm),
sentence-transformers' ONNX and OpenVINO backends and the two engines direct (the
anchors), and the fraction of the host's fp32 GEMM rate each of them reaches.

Run on demand, not in CI::

    OMP_NUM_THREADS=2 .venv/bin/python bench/embeddings.py [--texts 10000] [--repeats 3]
        [--case products|long] [--variants st,ort,ours-fp32,...]

The anchors need ``pip install -r bench/requirements-anchors.txt`` (the benchmark's own
packages, not the product's); without them, or when one fails, its row says
``not run: <reason>`` and the rest runs.

One invocation runs every variant in its own subprocess on the same texts with the same
thread count (so each peak RSS is that variant's own):

- ``st``: the shipped all-MiniLM-L6-v2 through sentence-transformers (PyTorch), batch
  size swept over 8/16/32/64/128 on a subset in the first round, the best one timed on
  all texts (every ``st*``, ``ort*`` and ``ov*`` variant is swept and timed the same way).
- ``st-onnx``, ``st-onnx-int8``, ``st-openvino``, ``st-openvino-int8``: the same model
  through sentence-transformers' own backends (``backend="onnx"`` / ``"openvino"``, which
  need optimum-onnx / optimum-intel): fp32; int8 by ``export_dynamic_quantized_onnx_model``
  with the config of this CPU (``avx512_vnni`` where it has those flags, else ``avx2``);
  static int8 by optimum-intel's ``OVQuantizer`` calibrated on the first 300 of the
  benchmark's texts (``export_static_quantized_openvino_model`` would download a hub
  data set). Their releases pin transformers below requirements.txt's (see
  ``bench/requirements-anchors.txt``), so they may say ``not run``.
- ``ort``, ``ort-int8``, ``ov``, ``ov-int8``: the same computation without optimum:
  the sentence-transformers model's BERT (transformers' default sdpa attention, as
  optimum exports it) exported with ``torch.onnx.export`` and run by ONNX Runtime
  (int8: ONNX Runtime's dynamic quantiser with the options of optimum's
  ``AutoQuantizationConfig`` for this CPU), or converted by ``openvino.convert_model``
  and run by OpenVINO in f32 (int8: ``nncf.quantize`` with the defaults of
  optimum-intel's ``OVQuantizationConfig``, calibrated on the first 300 texts, one text
  a sample, no padding); tokenised by the model's own fast tokenizer, length-sorted
  batches, mean pooling and normalisation as sentence-transformers does them.
- ``ours-fp32``, ``ours-bf16``: length bucketing + the unpadded forward of
  :mod:`embedfresh.ml.embedding.packed`, as the embed job runs it, in memory, no store;
  ``ours-fp32-padded``: the same buckets through the padded ``model.embed`` (what packing
  adds); ``ours-fp32-compiled``: the embed job's ``compile=true`` (the padded forward under
  torch.compile, static batches in the job's default buckets); ``ours-int8``: the embed
  job's ``quantize=int8`` (:func:`embedfresh.ml.embedding.precision.quantize_int8`,
  calibrated on the first texts), static batches in the job's buckets. The compiled
  variants' first pass compiles and is timed apart.

Both sides truncate at 256 tokens (the shipped model's ``max_seq_length``). Exports and
quantisation of the anchors run once, untimed, into the run's temporary folder (never
into the model package). The variants are interleaved: each round first measures the
fp32 GEMM rate (``torch.nn.functional.linear`` on the model's own shapes, 4096 tokens:
384 -> 1536, 1536 -> 384, 384 -> 384, same thread count), then runs every variant once
(one untimed warm-up batch, then one timed pass over all texts), so load from other
work on a shared machine hits all of them alike; the medians over rounds are reported.
The roofline column is the model FLOPs on real tokens (2 x the encoder's linear weights
per token, plus attention's 4 x length x hidden per token and layer, each text at its own
length after truncation) x texts/s over the measured fp32 GEMM FLOP/s.

``--case products`` (default) is the product corpus plus 10% long and non-English texts;
``--case long`` has texts of 100-400 tokens (uniform) in several scripts (Latin, Cyrillic,
CJK, Arabic, Devanagari, Hangul, Greek, Thai), corpus texts and multilingual lines joined
until a drawn token count of the shipped tokenizer. Last subprocesses run the embed job's
fast-mode quality gates, bf16 and int8
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
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ST_BACKENDS = ("st-onnx", "st-onnx-int8", "st-openvino", "st-openvino-int8")
ENGINES = ("ort", "ort-int8", "ov", "ov-int8")
ANCHORS = (*ST_BACKENDS, *ENGINES)
ST_LIKE = ("st", *ANCHORS)  # batch-size sweep, then encode(texts, batch_size)
OURS = ("ours-fp32", "ours-fp32-padded", "ours-fp32-compiled", "ours-int8", "ours-bf16")
TIMED = (*ST_LIKE, *OURS)
FAST_MODES = ("bf16", "int8")
CASES = ("products", "long")
MAX_LENGTH = 256
ST_BATCH_SIZES = (8, 16, 32, 64, 128)  # 16 was the best on an AVX-512 EPYC (2026-11-27)
SWEEP_TEXTS = 1000
# Ours, tuned for eager CPU: many lengths (little padding), no dummy rows.
LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
TOKEN_BUDGET = 4096
OV_CALIBRATION_TEXTS = 300  # optimum-intel's OVQuantizationConfig default num_samples
LONG_TOKENS = (100, 400)  # --case long: real tokens per text, uniform, before truncation
GEMM_REPEATS = 10
ANCHOR_PACKAGES = ("onnx", "onnxruntime", "openvino", "nncf", "optimum-onnx", "optimum-intel")
INT8_SUMMARY_KEYS = (
    "route",
    "calibration_texts",
    "calibration_tokens",
    "int8_layers",
    "activations",
    "between_gemms",
)

LONG_TEXTS = [
    "Das ist ein schöner Tag in München, die Straße ist ruhig und die Geschäfte sind offen.",
    "Café crème à emporter, s'il vous plaît. Où est la gare la plus proche de l'hôtel ?",
    "无线蓝牙耳机 主动降噪 长续航 适用于跑步和通勤 支持快速充电",
    "Zapatillas de running para hombre, impermeables, talla 44, suela de goma antideslizante.",
    "Беспроводные наушники с шумоподавлением и длительным временем работы от батареи.",
    "防水ハイキングブーツ、レザー、サイズ27センチ、軽量で歩きやすい",
]
# More scripts for --case long only (the products case keeps its texts of before).
MORE_SCRIPTS = [
    "سماعات لاسلكية مع خاصية إلغاء الضوضاء وعمر بطارية طويل، مناسبة للجري والتنقل اليومي.",
    "शोर रद्द करने वाले वायरलेस हेडफ़ोन, लंबी बैटरी लाइफ़ और तेज़ चार्जिंग के साथ।",
    "방수 등산화, 가죽 소재, 사이즈 270mm, 가볍고 편안한 착용감, 장거리 산행에 적합",
    "Αδιάβροχα παπούτσια πεζοπορίας από δέρμα, ελαφριά και άνετα για μεγάλες διαδρομές.",
    "รองเท้าวิ่งผู้ชาย กันน้ำ พื้นยางกันลื่น ขนาด 44 น้ำหนักเบา ระบายอากาศได้ดี",
]

LABELS = {
    "st": "sentence-transformers fp32",
    "st-onnx": "ST backend=onnx fp32",
    "st-onnx-int8": "ST backend=onnx int8 (dynamic)",
    "st-openvino": "ST backend=openvino fp32",
    "st-openvino-int8": "ST backend=openvino int8 (static)",
    "ort": "ONNX Runtime fp32 (direct)",
    "ort-int8": "ONNX Runtime int8 (dynamic, direct)",
    "ov": "OpenVINO fp32 (direct)",
    "ov-int8": "OpenVINO int8 (static, NNCF, direct)",
    "ours-fp32": "ours fp32",
    "ours-fp32-padded": "ours fp32, padded",
    "ours-fp32-compiled": "ours fp32, compiled (compile=true)",
    "ours-int8": "ours int8 (quantize=int8)",
    "ours-bf16": "ours bf16",
}


def make_texts(n: int, seed: int = 0, case: str = "products") -> list[str]:
    """The benchmark's texts: ``products``, product corpus texts plus ~10% longer and
    non-English ones, shuffled; ``long``, :func:`make_long_texts`."""
    if case == "long":
        return make_long_texts(n, seed)
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


def make_long_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of a drawn 100-400 real tokens each (the shipped tokenizer's count,
    [CLS] and [SEP] included, before truncation): corpus texts (Latin) and multilingual
    lines (Latin, Cyrillic, CJK, Arabic, Devanagari, Hangul, Greek, Thai), half and half,
    joined until the count is reached, then cut at that token."""
    from tokenizers import Tokenizer

    from embedfresh.ml.data.generate import generate_corpus
    from embedfresh.ml.model.presets import tokenizer_file

    rng = np.random.default_rng(seed)
    tok = Tokenizer.from_str(tokenizer_file().read_text())
    tok.no_truncation()
    tok.no_padding()
    corpus = generate_corpus(seed, max(1000, n // 4)).column("text").to_pylist()
    pool = corpus + LONG_TEXTS + MORE_SCRIPTS
    counts = [len(e.ids) for e in tok.encode_batch(pool, add_special_tokens=False)]
    lo, hi = LONG_TOKENS
    texts = []
    for _ in range(n):
        target = int(rng.integers(lo, hi + 1)) - 2  # without [CLS] and [SEP]
        parts, have = [], 0
        while have < target:
            if rng.random() < 0.5:
                j = int(rng.integers(len(corpus)))
            else:
                j = len(corpus) + int(rng.integers(len(pool) - len(corpus)))
            parts.append(pool[j])
            have += counts[j]
        text = " ".join(parts)
        enc = tok.encode(text, add_special_tokens=False)
        if len(enc.ids) > target:
            text = text[: enc.offsets[target - 1][1]]
        texts.append(text)
    return texts


def token_lengths(texts: list[str]) -> tuple[np.ndarray, int]:
    """Real tokens per text after truncation at :data:`MAX_LENGTH` ([CLS] and [SEP]
    included; the shipped tokenizer, as both sides run it), and how many were truncated."""
    from embedfresh.ml.embedding.bucketing import VariableTokenizer
    from embedfresh.ml.model.presets import tokenizer_file

    ids, truncated = VariableTokenizer(tokenizer_file().read_bytes(), MAX_LENGTH)(texts)
    return np.asarray(ids.lengths, dtype=np.int64), truncated


def model_flops(lengths: np.ndarray) -> np.ndarray:
    """FLOPs of minilm's encoder per text of ``lengths`` real tokens (no padding): 2 x
    the encoder's linear weights per token, plus attention's QK^T and AV, 4 x length x
    hidden per token and layer. Embeddings, LayerNorm, softmax and GELU are left out."""
    from embedfresh.ml.model.presets import get_spec

    enc = get_spec("minilm").encoder
    h, ffn, layers = enc.hidden_size, enc.intermediate_size, enc.num_hidden_layers
    linear_weights = layers * (4 * h * h + 2 * h * ffn)  # Q, K, V, output; FFN in and out
    n = lengths.astype(np.float64)
    return 2.0 * linear_weights * n + layers * 4.0 * h * n * n


def measure_gemm(repeats: int = GEMM_REPEATS) -> dict:
    """The host's fp32 GEMM rate on the model's own shapes (:data:`TOKEN_BUDGET` tokens
    through ``F.linear``, as ``nn.Linear`` runs them) with this process's torch threads:
    GFLOP/s of the three shapes in a row, median of ``repeats``, and each shape's."""
    import torch
    import torch.nn.functional as F

    from embedfresh.ml.model.presets import get_spec

    enc = get_spec("minilm").encoder
    h, ffn = enc.hidden_size, enc.intermediate_size
    shapes = ((TOKEN_BUDGET, h, ffn), (TOKEN_BUDGET, ffn, h), (TOKEN_BUDGET, h, h))
    torch.manual_seed(0)
    operands = [(torch.randn(m, k), torch.randn(n, k)) for m, k, n in shapes]
    seconds: list[list[float]] = [[] for _ in shapes]
    with torch.inference_mode():
        for x, w in operands:  # warm-up: thread pool, allocator, MKL's buffers
            F.linear(x, w)
        for _ in range(repeats):
            for i, (x, w) in enumerate(operands):
                t0 = time.perf_counter()
                F.linear(x, w)
                seconds[i].append(time.perf_counter() - t0)
    flops = [2 * m * k * n for m, k, n in shapes]
    per = {
        f"{m}x{k}@{k}x{n}": f / statistics.median(s) / 1e9
        for (m, k, n), f, s in zip(shapes, flops, seconds, strict=True)
    }
    total = sum(flops) / sum(statistics.median(s) for s in seconds) / 1e9
    return {"gflops": total, "per_shape": per, "threads": torch.get_num_threads()}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _time(fn, repeats: int) -> tuple[float, np.ndarray, list[float]]:
    seconds, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), out, seconds


# --- anchors -----------------------------------------------------------------------------


def _cpu_flags() -> set[str]:
    from embedfresh.core import cpuinfo

    return set(cpuinfo.field("flags").split())


def _onnx_int8_config() -> str:
    """The ``AutoQuantizationConfig`` of this CPU, as sentence-transformers names it."""
    return "avx512_vnni" if "avx512_vnni" in _cpu_flags() else "avx2"


def _require(module: str, package: str) -> None:
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise RuntimeError(
            f"{package} is not installed (no module {module}; bench/requirements-anchors.txt "
            "says why)"
        )


def _st_dir(work: Path, variant: str) -> Path:
    """A copy of the shipped sentence-transformers directory in the variant's workdir:
    the ST backends write their exports beside the model, never into the package."""
    from embedfresh.ml.model.presets import minilm_dir

    d = work / variant / "model"
    if not d.exists():
        shutil.copytree(minilm_dir(), d)
    return d


def _ov_config(threads: int) -> dict:
    # f32: OpenVINO's CPU plugin runs bf16 by default where the CPU has AMX / AVX512-BF16.
    # LATENCY is what optimum-intel sets when nothing is given.
    return {
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
    }


def _ort_session_options(threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return so


def _load_st(variant: str, work: Path, threads: int, prep: dict):
    from sentence_transformers import SentenceTransformer

    from embedfresh.ml.model.presets import minilm_dir

    if variant == "st":
        st = SentenceTransformer(str(minilm_dir()), device="cpu")
    elif variant.startswith("st-onnx"):
        _require("optimum.onnxruntime", "optimum-onnx")
        kwargs = {
            "file_name": prep["file_name"],
            "provider": "CPUExecutionProvider",
            "session_options": _ort_session_options(threads),
        }
        st = SentenceTransformer(
            str(_st_dir(work, variant)), device="cpu", backend="onnx", model_kwargs=kwargs
        )
    else:
        _require("optimum.intel", "optimum-intel")
        kwargs = {"file_name": prep["file_name"], "ov_config": _ov_config(threads)}
        st = SentenceTransformer(
            str(_st_dir(work, variant)), device="cpu", backend="openvino", model_kwargs=kwargs
        )
    st.max_seq_length = MAX_LENGTH
    return st


def _prepare_st_backend(variant: str, work: Path, texts: list[str], threads: int) -> dict:
    """Export (and quantise) through sentence-transformers' own functions into the
    variant's copy of the model directory; untimed."""
    from sentence_transformers import SentenceTransformer

    d = _st_dir(work, variant)
    if variant.startswith("st-onnx"):
        _require("optimum.onnxruntime", "optimum-onnx")
        st = SentenceTransformer(str(d), device="cpu", backend="onnx")
        st.save_pretrained(str(d))  # onnx/model.onnx
        if variant == "st-onnx":
            return {"file_name": "onnx/model.onnx"}
        from sentence_transformers.backend import export_dynamic_quantized_onnx_model

        config = _onnx_int8_config()
        export_dynamic_quantized_onnx_model(st, config, str(d))
        return {"file_name": f"onnx/model_qint8_{config}.onnx", "config": config}
    _require("optimum.intel", "optimum-intel")
    st = SentenceTransformer(
        str(d), device="cpu", backend="openvino", model_kwargs={"ov_config": _ov_config(threads)}
    )
    st.save_pretrained(str(d))  # openvino/openvino_model.xml
    if variant == "st-openvino":
        return {"file_name": "openvino/openvino_model.xml"}
    # export_static_quantized_openvino_model's own steps, calibrated on local texts: it
    # would load nyu-mll/glue from the hub (and pad every sample to 384 tokens).
    import nncf
    from optimum.intel import OVConfig, OVQuantizationConfig, OVQuantizer
    from sentence_transformers.backend.utils import save_or_push_to_hub_model

    quantization_config = OVQuantizationConfig(num_samples=OV_CALIBRATION_TEXTS)
    ov_config = OVConfig(quantization_config=quantization_config)
    quantizer = OVQuantizer.from_pretrained(st.transformers_model)
    names = [i.get_any_name() for i in st.transformers_model.model.inputs]
    calibration = nncf.Dataset(_calibration_items(st.tokenizer, texts, names))
    save_or_push_to_hub_model(
        export_function=lambda save_dir: quantizer.quantize(
            calibration_dataset=calibration, save_directory=save_dir, ov_config=ov_config
        ),
        export_function_name="export_static_quantized_openvino_model",
        config=quantization_config,
        model_name_or_path=str(d),
        file_suffix="qint8_quantized",
        backend="openvino",
        model=st,
    )
    return {
        "file_name": "openvino/openvino_model_qint8_quantized.xml",
        "calibration_texts": min(len(texts), OV_CALIBRATION_TEXTS),
    }


def _calibration_items(tokenizer, texts: list[str], names: list[str]) -> list[dict]:
    """The first :data:`OV_CALIBRATION_TEXTS` texts, one a sample at its own length
    (truncated at :data:`MAX_LENGTH`, no padding)."""
    items = []
    for text in texts[:OV_CALIBRATION_TEXTS]:
        enc = tokenizer(text, truncation=True, max_length=MAX_LENGTH, return_tensors="np")
        items.append({k: enc[k].astype(np.int64) for k in names})
    return items


class _Hidden:
    """The sentence-transformers model's BERT as ``(ids, mask, types) -> last hidden
    state``: the graph both engines run (pooling and normalisation stay outside, as
    optimum's feature-extraction models leave them to sentence-transformers)."""

    INPUTS = ("input_ids", "attention_mask", "token_type_ids")

    @staticmethod
    def module():
        import torch
        from sentence_transformers import SentenceTransformer

        from embedfresh.ml.model.presets import minilm_dir

        st = SentenceTransformer(str(minilm_dir()), device="cpu")
        bert = st[0].auto_model.eval()

        class Hidden(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bert = bert

            def forward(self, input_ids, attention_mask, token_type_ids):
                out = self.bert(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    token_type_ids=token_type_ids,
                )
                return out.last_hidden_state

        return Hidden().eval(), st.tokenizer


def _export_onnx(path: Path, texts: list[str]) -> None:
    import torch

    module, tokenizer = _Hidden.module()
    enc = tokenizer(
        texts[:2], padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
    )
    axes = {0: "batch", 1: "sequence"}
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            module,
            tuple(enc[k] for k in _Hidden.INPUTS),
            str(path),
            input_names=list(_Hidden.INPUTS),
            output_names=["last_hidden_state"],
            dynamic_axes={k: axes for k in (*_Hidden.INPUTS, "last_hidden_state")},
            opset_version=17,
            dynamo=False,  # the TorchScript exporter, as optimum's exporter uses
        )


def _quantize_onnx_dynamic(src: Path, dst: Path) -> str:
    """ONNX Runtime's dynamic int8 quantiser with the options of optimum's
    ``AutoQuantizationConfig.<config>(is_static=False)`` (what
    ``export_dynamic_quantized_onnx_model`` runs): weights int8 symmetric per channel,
    activations uint8 asymmetric, full range, every integer-op kind."""
    import onnx
    from onnxruntime.quantization import QuantizationMode, QuantType
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    config = _onnx_int8_config()
    quantizer = ONNXQuantizer(
        onnx.load(str(src)),
        per_channel=True,
        reduce_range=False,
        mode=QuantizationMode.IntegerOps,
        static=False,
        weight_qType=QuantType.QInt8,
        activation_qType=QuantType.QUInt8,
        tensors_range=None,
        nodes_to_quantize=[],
        nodes_to_exclude=[],
        op_types_to_quantize=list(IntegerOpsRegistry),
        extra_options={
            "WeightSymmetric": True,
            "ActivationSymmetric": False,
            "EnableSubgraph": False,
            "ForceSymmetric": False,
            "AddQDQPairToWeight": False,
            "DedicatedQDQPair": False,
            "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},
        },
    )
    quantizer.quantize_model()
    quantizer.model.save_model_to_file(str(dst))
    return config


def _prepare_engine(variant: str, work: Path, texts: list[str]) -> dict:
    d = work / variant
    d.mkdir(parents=True, exist_ok=True)
    if variant.startswith("ort"):
        _require("onnxruntime", "onnxruntime")
        _export_onnx(d / "model.onnx", texts)
        if variant == "ort":
            return {"file_name": "model.onnx"}
        config = _quantize_onnx_dynamic(d / "model.onnx", d / "model_qint8.onnx")
        return {"file_name": "model_qint8.onnx", "config": config}
    _require("openvino", "openvino")
    import openvino as ov
    import torch

    module, tokenizer = _Hidden.module()
    enc = tokenizer(
        texts[:2], padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
    )
    with torch.no_grad():
        model = ov.convert_model(module, example_input={k: enc[k] for k in _Hidden.INPUTS})
    out: dict = {"file_name": "model.xml"}
    if variant == "ov-int8":
        _require("nncf", "nncf")
        import nncf

        # optimum-intel's OVQuantizationConfig() as nncf.quantize arguments (sym=False:
        # the mixed preset; transformer model type; fast bias correction; no overflow fix).
        items = _calibration_items(tokenizer, texts, list(_Hidden.INPUTS))
        model = nncf.quantize(
            model,
            nncf.Dataset(items),
            preset=nncf.QuantizationPreset.MIXED,
            subset_size=OV_CALIBRATION_TEXTS,
            fast_bias_correction=True,
            model_type=nncf.ModelType.TRANSFORMER,
            advanced_parameters=nncf.AdvancedQuantizationParameters(
                overflow_fix=nncf.OverflowFix.DISABLE
            ),
        )
        out["calibration_texts"] = len(items)
    ov.save_model(model, str(d / "model.xml"), compress_to_fp16=False)
    return out


def _engine_encoder(variant: str, work: Path, threads: int, prep: dict) -> Callable:
    """``encode(texts, batch_size)`` as ``SentenceTransformer.encode`` runs it (longest
    texts first, batches padded to their longest text, mean pooling, L2 normalisation),
    the graph run by ONNX Runtime or OpenVINO."""
    from transformers import AutoTokenizer

    from embedfresh.ml.model.presets import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    path = work / variant / prep["file_name"]
    if variant.startswith("ort"):
        import onnxruntime as ort

        session = ort.InferenceSession(
            str(path), _ort_session_options(threads), providers=["CPUExecutionProvider"]
        )

        def run(feed: dict) -> np.ndarray:
            return session.run(None, feed)[0]
    else:
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(path)), "CPU", _ov_config(threads))
        request = compiled.create_infer_request()
        output = compiled.output(0)

        def run(feed: dict) -> np.ndarray:
            return request.infer(feed)[output]

    def encode(texts: list[str], batch_size: int) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = None
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            enc = tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="np",
            )
            hidden = run({k: enc[k].astype(np.int64) for k in _Hidden.INPUTS})
            mask = enc["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
            if out is None:
                out = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            out[idx] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out

    return encode


def prepare_anchor(variant: str, work: Path, texts: list[str]) -> dict:
    import torch

    t0 = time.perf_counter()
    if variant in ST_BACKENDS:
        out = _prepare_st_backend(variant, work, texts, torch.get_num_threads())
    else:
        out = _prepare_engine(variant, work, texts)
    out["export_s"] = round(time.perf_counter() - t0, 1)
    return out


# --- the timed child ---------------------------------------------------------------------


def run_variant(
    variant: str, texts: list[str], repeats: int, work: Path, batch_size: int | None = None
) -> tuple[dict, np.ndarray]:
    import torch

    threads = torch.get_num_threads()
    result: dict = {"variant": variant, "threads": threads, "texts": len(texts)}
    if variant in ST_LIKE:
        os.environ["HF_HUB_OFFLINE"] = "1"
        prep_path = work / f"{variant}.prep.json"
        prep = json.loads(prep_path.read_text()) if prep_path.exists() else {}
        if variant in ENGINES:
            encode = _engine_encoder(variant, work, threads, prep)
        else:
            st = _load_st(variant, work, threads, prep)

            def encode(batch: list[str], bs: int) -> np.ndarray:
                return st.encode(batch, batch_size=bs, convert_to_numpy=True)

        encode(texts[:64], 64)  # warm-up
        sweep = {}
        subset = texts[:SWEEP_TEXTS]
        for bs in ST_BATCH_SIZES if batch_size is None else ():
            t0 = time.perf_counter()
            encode(subset, bs)
            sweep[bs] = len(subset) / (time.perf_counter() - t0)
        best = max(sweep, key=sweep.get) if batch_size is None else batch_size
        median, vectors, all_s = _time(lambda: encode(texts, best), repeats)
        result.update(
            batch_size=best, sweep={str(k): round(v, 1) for k, v in sweep.items()}, **prep
        )
    else:
        from embedfresh.core.config.embedding import DEFAULT_LENGTHS
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
        job_lengths = tuple(n for n in DEFAULT_LENGTHS if n <= MAX_LENGTH)
        lengths, static, packed, forward = LENGTHS, False, variant != "ours-fp32-padded", None
        first_pass = False  # whether the warm-up is a whole pass (it compiles)
        if variant == "ours-int8":  # calibrated on the first texts, as the embed job does
            from embedfresh.ml.embedding.precision import quantize_int8

            t0 = time.perf_counter()
            model, summary = quantize_int8(model, backend, tok(texts[:512])[0])
            result["quantize_s"] = round(time.perf_counter() - t0, 1)
            result["int8"] = {k: summary[k] for k in INT8_SUMMARY_KEYS if k in summary}
            # The embed job's int8: a compiled graph per bucket, static batches, padded.
            lengths, static, packed, first_pass = job_lengths, True, False, True
        elif variant == "ours-bf16":
            from embedfresh.ml.embedding.precision import to_bf16

            model, _ = to_bf16(model, backend)
        elif variant == "ours-fp32-compiled":  # the embed job's compile=true: its buckets
            lengths, static, first_pass = job_lengths, True, True
            forward = backend.compile(model.embed)
        hidden = spec.encoder.hidden_size

        def run() -> np.ndarray:  # tokenisation included, as sentence-transformers does
            return embed_texts(
                model, backend, tok, texts, lengths, TOKEN_BUDGET, hidden, static, packed, forward
            )

        # Warm-up: a compiled forward compiles (or loads from inductor's cache) a graph per
        # bucket on its first pass over all texts, timed apart.
        t0 = time.perf_counter()
        if first_pass:
            run()
        else:
            embed_texts(
                model, backend, tok, texts[:64], lengths, TOKEN_BUDGET, hidden, static, packed
            )
        result["warm_up_s"] = round(time.perf_counter() - t0, 3)
        median, vectors, all_s = _time(run, repeats)
        result.update(
            lengths=list(lengths), token_budget=TOKEN_BUDGET, packed=packed, static=static
        )
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
        fast, summary = quantize_int8(
            model, backend, tok([spec.prompt("document") + t for t in texts])[0]
        )
        extra = {"quantization": {k: summary[k] for k in INT8_SUMMARY_KEYS if k in summary}}
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
    if args.variant == "gemm":
        (work / "gemm.json").write_text(json.dumps(measure_gemm()))
        return
    if args.variant.startswith("gate-"):
        out = run_gate(work, args.gate_eval_rows, args.variant.removeprefix("gate-"))
        (work / f"{args.variant}.json").write_text(json.dumps(out))
        return
    texts = json.loads((work / "texts.json").read_text())
    if args.prepare:
        prep = prepare_anchor(args.variant, work, texts)
        (work / f"{args.variant}.prep.json").write_text(json.dumps(prep))
        return
    out, vectors = run_variant(args.variant, texts, args.repeats, work, args.batch_size)
    np.save(work / f"{args.variant}.npy", vectors)
    (work / f"{args.variant}.json").write_text(json.dumps(out))


# --- the parent --------------------------------------------------------------------------


def _machine() -> str:
    from _common import cpu_isa, cpu_model

    return (
        f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}, torch "
        f"dispatches to {cpu_isa()}, Python {platform.python_version()}"
    )


def _versions() -> str:
    def version(name: str) -> str:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return f"{name} not installed"

    return ", ".join(
        version(n) for n in ("torch", "transformers", "sentence-transformers", *ANCHOR_PACKAGES)
    )


def _spawn(cmd: list[str], env: dict[str, str], log: Path, what: str) -> str | None:
    """Run a child with its output in ``log``; ``None`` when it succeeded, else why not
    (its exit status and the last line of its output), the end of which is printed."""
    with log.open("w") as out:
        rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc == 0:
        return None
    lines = [ln.rstrip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    tail = "\n".join(f"    {ln}" for ln in lines[-25:])
    print(
        f"  {what} failed (exit status {rc}); the end of its output:\n{tail}",
        file=sys.stderr,
        flush=True,
    )
    status = f"killed by signal {-rc}" if rc < 0 else f"exit {rc}"
    # The exception's own line (a traceback may go on with more lines of its message).
    raised = [ln.strip() for ln in lines if re.match(r"\s*[\w.]*(Error|Exception)\b: \S", ln)]
    last = (raised or [ln.strip() for ln in lines] or ["no output"])[-1]
    if len(last) > 240:
        last = last[:237] + "..."
    return f"{status}: {last}".replace("|", "/")


def _parse_variants(value: str) -> tuple[str, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in names if v not in TIMED]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {unknown or value!r}: choose from {', '.join(TIMED)}"
        )
    return tuple(v for v in TIMED if v in names)  # the benchmark's order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--case",
        choices=CASES,
        default="products",
        help="products: the corpus mix with 10%% long / non-English texts; long: 100-400 "
        "tokens a text in several scripts (default: %(default)s)",
    )
    parser.add_argument(
        "--variants",
        type=_parse_variants,
        default=TIMED,
        help=f"the timed variants to run, comma-separated (default: all: {','.join(TIMED)})",
    )
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
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        _child(args)
        return

    from _common import command_line

    started = time.perf_counter()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "true",
        "PYTHONPATH": str(ROOT),
    }
    cmd_text = command_line(args.threads)
    modes = [m for m in args.gate_modes.split(",") if m] if args.gate_eval_rows else []
    if args.gate_only:
        with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
            gates = _run_gates(tmp, env, args.gate_eval_rows, modes)
        text = "\n".join(
            [
                f"## Fast modes' quality gate on minilm ({dt.date.today().isoformat()})",
                "",
                f"- Command: `{cmd_text}`",
                f"- Machine: {_machine()}; {args.threads} torch threads",
                *(_gate_line(m, g) for m, g in gates.items()),
                f"- Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s",
                "",
            ]
        )
        _emit(args, text)
        return

    variants: tuple[str, ...] = args.variants
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    gemm: list[dict] = []
    texts = make_texts(args.texts, case=args.case)
    lengths, truncated = token_lengths(texts)
    flops_per_text = float(model_flops(lengths).mean())
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        work = Path(tmp)
        (work / "texts.json").write_text(json.dumps(texts))

        def child(variant: str, *extra: str) -> list[str]:
            return [sys.executable, __file__, "--variant", variant, "--workdir", tmp, *extra]

        for variant in (v for v in variants if v in ANCHORS):  # exports: once, untimed
            print(f"exporting {variant} ...", file=sys.stderr, flush=True)
            why = _spawn(
                child(variant, "--prepare"),
                env,
                work / f"{variant}.prep.log",
                f"{variant} (export)",
            )
            if why:
                failed[variant] = f"export failed, {why}"
        for r in range(args.repeats):
            print(f"round {r + 1}: fp32 GEMM rate ...", file=sys.stderr, flush=True)
            why = _spawn(child("gemm"), env, work / "gemm.log", "GEMM rate")
            if why is None:
                gemm.append(json.loads((work / "gemm.json").read_text()))
            for variant in (v for v in variants if v not in failed):
                print(f"round {r + 1}: {variant} ...", file=sys.stderr, flush=True)
                cmd = child(variant, "--repeats", "1")
                if variant in ST_LIKE and r:
                    cmd += ["--batch-size", str(results[variant]["batch_size"])]
                why = _spawn(cmd, env, work / f"{variant}.log", variant)
                if why:
                    failed[variant] = why
                    results.pop(variant, None)
                    continue
                out = json.loads((work / f"{variant}.json").read_text())
                if variant in results:  # later rounds add their timing and peak to the first's
                    first = results[variant]
                    first["seconds"] += out["seconds"]
                    first["peak_rss_mib"] = max(first["peak_rss_mib"], out["peak_rss_mib"])
                else:
                    results[variant] = out
        ran = [v for v in variants if v in results]
        for out in (results[v] for v in ran):
            out["sentences_per_s"] = out["texts"] / statistics.median(out["seconds"])
        gates = _run_gates(tmp, env, args.gate_eval_rows, modes)
        if "st" in results:
            st_vec = np.load(work / "st.npy")
            results["st"]["max_abs_1_minus_cos"] = 0.0
            for variant in (v for v in ran if v != "st"):
                v = np.load(work / f"{variant}.npy")
                cos = (
                    (v * st_vec).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(st_vec, axis=1)
                )
                results[variant]["max_abs_1_minus_cos"] = float(np.abs(1 - cos).max())

    gemm_gflops = statistics.median(g["gflops"] for g in gemm) if gemm else None
    st_rate = results["st"]["sentences_per_s"] if "st" in results else None

    def verdict(mode: str) -> str:
        if mode not in gates:
            return f"{mode} gate not run"
        return f"{mode} gate: {gates[mode].get('verdict', 'failed')}"

    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.embedding.packed import onednn_is_faster
    from embedfresh.ml.embedding.precision import native_bf16

    gemm_lib = "oneDNN" if onednn_is_faster() else "MKL"  # the packed forward's GEMMs
    bf16 = "native bf16" if native_bf16(get_backend("cpu")) else "bf16 emulated"

    def note(variant: str) -> str:
        r = results[variant]
        if variant in ST_LIKE:
            parts = [f"batch {r['batch_size']}"]
            if "config" in r:
                parts.append(f"config {r['config']}")
            if "calibration_texts" in r:
                parts.append(f"calibrated on {r['calibration_texts']} texts")
            if "export_s" in r:
                parts.append(f"export {r['export_s']:.0f} s (untimed)")
            return ", ".join(parts)
        if variant == "ours-fp32":
            return f"bucketed, budget {TOKEN_BUDGET}, packed, {gemm_lib}"
        if variant == "ours-fp32-padded":
            return "same buckets, padded"
        if variant == "ours-fp32-compiled":
            return (
                "torch.compile, static batches in the embed job's buckets; first pass "
                f"{r['warm_up_s']:.0f} s (compiles, or loads inductor's cache in later rounds)"
            )
        if variant == "ours-int8":
            q = r.get("int8", {})
            how = ", ".join(
                str(x)
                for x in (
                    q.get("route"),
                    q.get("int8_layers") is not None and f"{q['int8_layers']} layers int8",
                    q.get("activations") and f"activations {q['activations']}",
                    q.get("between_gemms") and f"between GEMMs {q['between_gemms']}",
                )
                if x
            )
            return (
                f"{how}; static batches in the embed job's buckets; quantised in "
                f"{r.get('quantize_s', 0):.0f} s, first pass {r['warm_up_s']:.0f} s "
                f"(compiles); {verdict('int8')}"
            )
        return f"packed, {bf16}; {verdict('bf16')}"

    def fmt(x: float | None, spec: str, suffix: str = "") -> str:
        return "-" if x is None else f"{x:{spec}}{suffix}"

    lines = [
        f"| variant | sentences/s (median of {args.repeats}) | vs ST | roofline (fp32 GEMM) "
        "| max abs(1 - cos) vs ST | peak RSS MiB | notes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for variant in variants:
        name = LABELS[variant]
        if variant not in results:
            reason = failed.get(variant, "no result")
            lines.append(f"| {name} | not run: {reason} | - | - | - | - | |")
            continue
        r = results[variant]
        rate = r["sentences_per_s"]
        roof = rate * flops_per_text / (gemm_gflops * 1e9) if gemm_gflops else None
        lines.append(
            f"| {name} | {rate:.1f} | {fmt(rate / st_rate if st_rate else None, '.2f', 'x')} | "
            f"{fmt(roof * 100 if roof is not None else None, '.1f', '%')} | "
            f"{fmt(r.get('max_abs_1_minus_cos'), '.2e')} | {r['peak_rss_mib']:.0f} | "
            f"{note(variant)} |"
        )
    sweeps = "; ".join(
        f"{v} " + ", ".join(f"{k}: {s}" for k, s in results[v]["sweep"].items())
        for v in variants
        if v in results and results[v].get("sweep")
    )
    case = (
        "product corpus + 10% long / non-English"
        if args.case == "products"
        else f"long: {LONG_TOKENS[0]}-{LONG_TOKENS[1]} tokens a text (uniform, before "
        "truncation), Latin, Cyrillic, CJK, Arabic, Devanagari, Hangul, Greek and Thai"
    )
    if gemm:
        shapes = ", ".join(
            f"{k} {statistics.median(g['per_shape'][k] for g in gemm):.1f}"
            for k in gemm[0]["per_shape"]
        )
        gemm_line = (
            f"- fp32 GEMM rate (torch `F.linear`, {gemm[0]['threads']} threads, median of "
            f"{len(gemm)} rounds x {GEMM_REPEATS}): **{gemm_gflops:.1f} GFLOP/s** on the "
            f"model's shapes ({shapes} GFLOP/s); per round: "
            + ", ".join(f"{g['gflops']:.1f}" for g in gemm)
        )
    else:
        gemm_line = "- fp32 GEMM rate: not measured (the child failed: roofline not computed)"
    timings = "; ".join(f"{v} {results[v]['seconds']}" for v in variants if v in results)
    text = "\n".join(
        [
            f"## Embeddings: ours vs sentence-transformers and the anchors, case {args.case} "
            f"({dt.date.today().isoformat()})",
            "",
            f"- Command: `{cmd_text}`",
            f"- Machine: {_machine()}; {args.threads} threads in every variant (torch, "
            "ONNX Runtime intra-op, OpenVINO inference threads)",
            f"- Versions: {_versions()}",
            f"- {args.texts} texts, case {args.case} ({case}); real tokens a text after "
            f"truncation at {MAX_LENGTH}: mean {lengths.mean():.1f}, median "
            f"{float(np.median(lengths)):.0f}, max {lengths.max()}; {truncated} truncated at "
            f"{MAX_LENGTH}; {lengths.sum():,} tokens in all. Max length {MAX_LENGTH} on every "
            "side; each variant in its own process (peak RSS = ru_maxrss)",
            gemm_line,
            f"- Roofline: model FLOPs on real tokens ({flops_per_text / 1e9:.3f} GFLOP a text "
            "on average: 2 x the encoder's linear weights per token + attention 4 x length x "
            "hidden per token and layer) x texts/s over the fp32 GEMM rate; int8 and bf16 rows "
            "are set against the fp32 rate too",
            f"- {args.repeats} interleaved rounds (the GEMM rate, then every variant once a "
            "round, fresh processes); anchors exported once before the rounds, untimed; "
            "timings per round (s): " + timings,
            f"- Load average (1, 5, 15 min) at the end: {os.getloadavg()}",
            f"- Batch-size sweeps on {min(SWEEP_TEXTS, args.texts)} texts (sentences/s): "
            + (sweeps or "none"),
            f"- Ours: lengths {list(LENGTHS)}, token budget {TOKEN_BUDGET}, no dummy rows "
            "(compiled and int8: the embed job's buckets, static batches)",
            *(_gate_line(m, g) for m, g in gates.items()),
            *([] if gates else ["- Fast modes' quality gate: not run (--gate-eval-rows 0)"]),
            "- Goals (issue 38): fp32 >= 1.5x ST (cosine >= 0.99999 per row) and >= ONNX fp32; "
            "the fastest mode whose gate PASSes >= 4x ST and >= OpenVINO int8; the whole "
            "fp32 embed >= 60% of the fp32 GEMM roofline",
            f"- Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s",
            "",
            *lines,
            "",
        ]
    )
    _emit(args, text)


def _run_gates(tmp: str, env: dict[str, str], eval_rows: int, modes: list[str]) -> dict:
    """Each mode's gate in a child; a failed child is reported as such, not raised."""
    gates = {}
    for mode in modes:
        print(f"{mode} quality gate on {eval_rows} eval rows ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--variant", f"gate-{mode}", "--workdir", tmp]
        cmd += ["--gate-eval-rows", str(eval_rows)]
        why = _spawn(cmd, env, Path(tmp) / f"gate-{mode}.log", f"{mode} gate")
        if why:
            gates[mode] = {"mode": mode, "error": why}
        else:
            gates[mode] = json.loads((Path(tmp) / f"gate-{mode}.json").read_text())
    return gates


def _gate_line(mode: str, gate: dict) -> str:
    if "error" in gate:
        return f"- {mode} quality gate: not run: {gate['error']}"
    lo, hi = gate["ci"] or (float("nan"), float("nan"))
    if mode == "int8":
        q = gate.get("quantization", {})
        how = ", ".join(
            x
            for x in (
                q.get("route") and f"route {q['route']}",
                f"calibration {q.get('calibration_texts')} corpus texts "
                f"({q.get('calibration_tokens')} tokens)",
                f"{q.get('int8_layers')} layers int8",
                q.get("activations") and f"activations {q['activations']}",
                q.get("between_gemms") and f"between GEMMs {q['between_gemms']}",
            )
            if x
        )
    else:
        native = gate.get("native_bf16")
        how = "native bf16" if native else "bf16 emulated (no AMX / AVX512-BF16)"
    d = gate["d"] if gate["d"] is not None else float("nan")
    return (
        f"- {mode} quality gate (embed job defaults, max length {gate['max_length']}, "
        f"{gate['eval_rows']:,} eval rows: {gate['n_queries']:,} queries over "
        f"{gate['n_products']:,} products, {gate['seconds']} s): **{gate['verdict']}**, "
        f"recall@10 fp32 {gate['recall_fp32']} vs {mode} {gate['recall_fast']}, d = "
        f"{d:+.4%}, one-sided 95% lower bound {lo:+.4%} (90% interval [{lo:+.4%}, "
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
