"""A team's own model, built in the test: a BERT-type encoder with random weights, its
own cased WordPiece tokenizer trained on multi-script text, and a ``max_seq_length`` of
384 (over the 256 of the demo's MiniLM), saved as a sentence-transformers directory."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from embedfresh.core.storage import ArtifactStore

MAX_SEQ_LENGTH = 384
HIDDEN = 48

CORPUS = [
    "Größe 44, wasserdichte Wanderschuhe aus Leder für Übergangszeiten",
    "سماعات لاسلكية مع خاصية إلغاء الضوضاء وعمر بطارية طويل",
    "Tai nghe không dây chống ồn, pin dùng lâu, phù hợp khi chạy bộ",
    "Ασύρματα ακουστικά με ακύρωση θορύβου και μεγάλη διάρκεια μπαταρίας",
    "หูฟังไร้สายตัดเสียงรบกวน แบตเตอรี่ใช้งานได้นาน",
    "वायरलेस हेडफ़ोन, शोर रद्द करने वाला, लंबी बैटरी",
    "无线蓝牙耳机，主动降噪，长续航，适用于跑步和通勤",
    "Wireless Headphones with Noise Cancelling and a long Battery life, Size M, Red",
]


def build_own_model(
    directory: Path,
    model_type: str = "bert",
    seed: int = 0,
    pooling: str = "mean",
    dense: int | None = None,
    prompts: dict[str, str] | None = None,
    shape: dict[str, int] | None = None,
) -> Path:
    """Write the model to ``directory`` (sentence-transformers layout); returns it.

    ``model_type``: ``bert`` (the fast path), ``distilbert`` (another architecture, with
    its own config names: the generic path) or ``mpnet`` (generic, positions offset by
    the pad id, no sdpa attention in transformers); ``pooling``: ``mean``, ``cls``, ``max``;
    ``dense``: a Dense module (tanh) to this many features after pooling; ``prompts``:
    the model's query/document prompts; ``shape``: the transformers config's own size
    fields (``MPNetConfig()``'s defaults are all-mpnet-base-v2's shape), over the small
    test shape.

    Two builds are two models, even with the same ``seed``: the WordPiece trainer numbers
    its vocabulary in hash-map order (``TOKENIZERS_PARALLELISM=false`` too), so token ids,
    and with them the vectors, differ from build to build. Where two artifact roots must
    agree, build once and publish the same directory into both."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from tokenizers.trainers import WordPieceTrainer
    from transformers import (
        BertConfig,
        BertModel,
        BertTokenizerFast,
        DistilBertConfig,
        DistilBertModel,
        MPNetConfig,
        MPNetModel,
    )

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    # Cased, unlike MiniLM's: an export that lower-cased would cut other tokens.
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS * 20, WordPieceTrainer(vocab_size=1500, special_tokens=specials))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    hf_dir = directory.parent / f"{directory.name}-hf"
    fast = BertTokenizerFast(
        tokenizer_object=tok,
        do_lower_case=False,
        **dict(
            zip(
                ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                specials,
                strict=True,
            )
        ),
    )
    fast.save_pretrained(hf_dir)
    torch.manual_seed(seed)
    size = {"vocab_size": tok.get_vocab_size(), "pad_token_id": 0, **(shape or {})}
    if model_type == "bert":
        config = BertConfig(
            **{
                "hidden_size": HIDDEN,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 96,
                "max_position_embeddings": 512,
                **size,
            }
        )
        BertModel(config).save_pretrained(hf_dir, safe_serialization=True)
    elif model_type == "mpnet":  # positions start after the pad id, as RoBERTa's do
        config = MPNetConfig(
            **{
                "hidden_size": HIDDEN,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 96,
                "max_position_embeddings": 514,
                **size,
            }
        )
        MPNetModel(config).save_pretrained(hf_dir, safe_serialization=True)
    else:
        config = DistilBertConfig(
            **{
                "dim": HIDDEN,
                "n_layers": 2,
                "n_heads": 4,
                "hidden_dim": 96,
                "max_position_embeddings": 512,
                **size,
            }
        )
        DistilBertModel(config).save_pretrained(hf_dir, safe_serialization=True)
    hidden = getattr(config, "hidden_size", None) or config.dim
    transformer = Transformer(str(hf_dir), max_seq_length=MAX_SEQ_LENGTH)
    modules = [transformer, Pooling(hidden, pooling)]
    if dense:
        modules.append(Dense(hidden, dense, activation_function=torch.nn.Tanh()))
    st = SentenceTransformer(modules=[*modules, Normalize()], device="cpu", prompts=prompts)
    st.save(str(directory), safe_serialization=True)
    return directory


EOS = "<|endoftext|>"
DECODER_MAX_SEQ_LENGTH = 256
QUERY_INSTRUCTION = "Instruct: Given a product search query, retrieve relevant products\nQuery: "


def build_own_decoder(
    directory: Path,
    model_type: str = "qwen3",
    seed: int = 0,
    appends_eos: bool = True,
    sentence_transformers: bool = True,
) -> Path:
    """A decoder embedding model of ``model_type`` (``qwen3``, ``qwen2``, ``llama`` or
    ``mistral``) with random weights and its own byte-level BPE tokenizer trained on
    multi-script text, padding on the left as Qwen3-Embedding's does, written as a
    sentence-transformers directory (Transformer -> Pooling ``lasttoken`` -> Normalize,
    with a query instruction as Qwen3-Embedding's) or, ``sentence_transformers=False``,
    as the plain transformers directory alone.

    ``appends_eos``: the tokenizer appends the EOS token (the token last-token pooling
    reads), as Qwen3-Embedding's does; False: it does not (e5-mistral's fast tokenizer
    before ``add_eos_token=True``)."""
    import torch
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    from transformers import AutoConfig, AutoModel, PreTrainedTokenizerFast

    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS * 20,
        BpeTrainer(
            vocab_size=1200,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    eos_id = tok.token_to_id(EOS)
    if appends_eos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {EOS}", pair=f"$A {EOS} $B:1 {EOS}:1", special_tokens=[(EOS, eos_id)]
        )
    hf_dir = directory if not sentence_transformers else directory.parent / f"{directory.name}-hf"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS, padding_side="left"
    )
    fast.model_max_length = DECODER_MAX_SEQ_LENGTH
    fast.save_pretrained(hf_dir)
    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=eos_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    AutoModel.from_config(config).save_pretrained(hf_dir, safe_serialization=True)
    if not sentence_transformers:
        return hf_dir
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )

    transformer = Transformer(str(hf_dir), max_seq_length=DECODER_MAX_SEQ_LENGTH)
    st = SentenceTransformer(
        modules=[transformer, Pooling(HIDDEN, "lasttoken"), Normalize()],
        device="cpu",
        prompts={"query": QUERY_INSTRUCTION},
    )
    st.save(str(directory), safe_serialization=True)
    return directory


def last_json(done) -> dict:
    """The summary a job printed last, after checking it succeeded."""
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_corpus(store: ArtifactStore, corpus: str, texts: list[str], prefix: str) -> list[str]:
    """``texts`` as the one part of ``corpus``, with string ids (``prefix`` + a hash)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedfresh.core import layout

    ids = [f"{prefix}{hashlib.md5(t.encode()).hexdigest()[:12]}" for t in texts]
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": ids, "text": texts}), sink)
    store.write_bytes(f"{layout.corpus(corpus)}/part-00000.parquet", sink.getvalue())
    return ids


def embed_and_read(root: str, model: str, version: str, corpus: str) -> tuple[list, np.ndarray]:
    """Embed and verify ``corpus`` with the jobs; its ids and vectors, in order."""
    from embedfresh.core import layout
    from embedfresh.core.parquet import read_parquet
    from embedfresh.core.storage import ArtifactStore
    from tests.conftest import run_job

    sets = [f"artifact_root={root}", f"model={model}", f"version={version}", f"corpus={corpus}"]
    last_json(run_job("embed", *sets))
    last_json(run_job("embed_verify", *sets))
    store = ArtifactStore(root)
    t = read_parquet(store, f"{layout.embeddings(model, version, corpus)}/part-00000.parquet")
    vectors = t.column("embedding").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)
    return t.column("id").to_pylist(), vectors


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two sets of vectors."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
