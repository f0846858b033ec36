"""A team's own model, built in the test: a BERT-type encoder with random weights, its
own cased WordPiece tokenizer trained on multi-script text, and a ``max_seq_length`` of
384 (over the 256 of the demo's MiniLM), saved as a sentence-transformers directory."""

from __future__ import annotations

from pathlib import Path

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

