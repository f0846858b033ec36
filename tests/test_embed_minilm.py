"""``python -m embedfresh.jobs.embed`` with the minilm config writes sentence-transformers' vectors
for a varied, multilingual corpus: the whole job path (shards, prefetch, tokenisation
without padding, length buckets, Parquet) against ``SentenceTransformer.encode`` on the
shipped all-MiniLM-L6-v2, and texts over the max length truncated and counted."""

from __future__ import annotations

import os

# Before anything imports huggingface_hub: it reads these once, at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedfresh.core import layout
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec, minilm_dir
from tests.conftest import run_job

MAX_LENGTH = 256  # the shipped model's max_seq_length
MIN_COSINE = 0.99999

SHARDS = [
    [  # Latin scripts with accents, ligatures, punctuation
        "Das ist ein schöner Tag in München, die Straße ist ruhig und die Läden sind offen.",
        "Größe 44, wasserdichte Wanderschuhe aus Leder – ideal für Übergangszeiten!",
        "Café crème à emporter, s'il vous plaît. Où est la gare la plus proche ?",
        "Cœur d'artichaut, œuvre « naïve » — l'été à Noël.",
        "Zapatillas de running para hombre, talla 44, suela antideslizante.",
        "Beş çayı, ağaç, İstanbul; Łódź, Žluťoučký kůň.",
        "e\u0301te\u0301 (combining accents) and a zero\u200bwidth space",
    ],
    [  # Non-Latin scripts, right-to-left included
        "无线蓝牙耳机 主动降噪 长续航 适用于跑步和通勤",
        "防水ハイキングブーツ、レザー、サイズ27センチ、軽量で歩きやすい",
        "سماعات لاسلكية مع خاصية إلغاء الضوضاء وعمر بطارية طويل",
        "Беспроводные наушники с шумоподавлением.",
        "무선 블루투스 이어폰 노이즈 캔슬링",
        "वायरलेस हेडफ़ोन, लंबी बैटरी",
        "Ελληνικά: ασύρματα ακουστικά",
        "mixed: headphones سماعات 耳机 ヘッドホン",
    ],
    [  # Emoji, odd characters, empty, and texts far over the max length
        "🔥🔥 best deal 😀👍 limited offer",
        "👩‍👩‍👧‍👦 family pack 🇩🇪🇯🇵 flags",
        "",
        " ",
        "tabs\tand\nnew lines\r\n",
        "123 456.78 -9e3 0x1F 3/4 100%",
        " ".join(f"item{i} waterproof hiking boots, leather, size {i % 13}" for i in range(80)),
        "无线蓝牙耳机主动降噪长续航" * 40,
        "Das ist ein sehr langer Satz über Schuhe. " * 60,
    ],
]


def _write_corpus(store: ArtifactStore) -> tuple[list[int], list[str]]:
    ids, texts = [], []
    for i, shard in enumerate(SHARDS):
        shard_ids = [7_000_000 + 100 * i + j for j in range(len(shard))]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": pa.array(shard_ids, pa.int64()), "text": shard}), sink)
        store.write_bytes(
            f"{layout.corpus('world')}/{layout.part_name(i)}", sink.getvalue().to_pybytes()
        )
        ids += shard_ids
        texts += shard
    return ids, texts


def test_job_vectors_equal_sentence_transformers_on_a_multilingual_corpus(root: str) -> None:
    from sentence_transformers import SentenceTransformer

    store = ArtifactStore(root)
    spec = get_spec("minilm")
    model = versions.build_model(spec, 0)
    versions.load_base_weights(model)
    versions.publish(store, spec, "v1", cpu_state_dict(model), {})
    ids, texts = _write_corpus(store)

    sets = [f"artifact_root={root}", "model=minilm", "version=v1", "corpus=world"]
    done = run_job("embed", *sets, f"max_length={MAX_LENGTH}", "token_budget=2048")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == len(texts)
    check = run_job("embed_verify", *sets)
    assert check.returncode == 0, check.stderr

    out = layout.embeddings("minilm", "v1", "world")
    parts = [read_parquet(store, f"{out}/{layout.part_name(i)}") for i in range(len(SHARDS))]
    table = pa.concat_tables(parts)
    assert table.column("id").to_pylist() == ids
    ours = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(len(ids), -1)

    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    assert st.max_seq_length == MAX_LENGTH
    theirs = st.encode(texts, batch_size=16, convert_to_numpy=True)
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    worst = int(cos.argmin())
    assert cos.min() >= MIN_COSINE, f"min cosine {cos.min():.8f} for {texts[worst][:40]!r}"

    # Truncated: the texts whose full tokenisation (with [CLS]/[SEP]) exceeds the max.
    full = [len(ids_) for ids_ in st.tokenizer(texts, truncation=False)["input_ids"]]
    over = sum(n > MAX_LENGTH for n in full)
    assert over == 3
    report = store.read_json("runs/minilm/manual/reports/embed-world.json")
    assert report["truncated"] == over and report["rows"] == len(texts)
    assert report["max_length"] == MAX_LENGTH
