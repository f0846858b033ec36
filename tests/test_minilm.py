"""The ``minilm`` config loads offline and embeds exactly as sentence-transformers does.

Our encoder (embedfresh/ml/model/encoder.py) is a hand-written BERT; these tests pin it to the
reference implementation (sentence-transformers over transformers' ``BertModel``) on the
same all-MiniLM-L6-v2 files, so a silent drift in attention, masking, pooling or the
tokenizer shows up here rather than as a quietly worse production embedding.
"""

from __future__ import annotations

import os

# Before anything imports huggingface_hub: it reads these once, at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import ipaddress
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.model import versions
from embedfresh.ml.model.encoder import BertEncoder
from embedfresh.ml.model.presets import get_spec, minilm_dir, tokenizer_file
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.tokenizer import TextTokenizer

MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)
MIN_COSINE = 0.99999

TEXTS = [
    "hi",
    "",
    "Running shoes for men, size 44 - waterproof!",
    "USB-C cable (2m), 60W, braided; fits iPhone 15/16 & Pixel 8.",
    "123 456.78 -9e3 0x1F 3/4 100%",
    "A.B.C.!?;:--...,,,'\"()[]{}",
    "Das ist ein schöner Tag in München, die Straße ist ruhig.",
    "Café crème à emporter, s'il vous plaît. Où est la gare ?",
    "无线蓝牙耳机 主动降噪 长续航",
    "🔥🔥 best deal 😀👍 limited offer",
    "The quick brown fox jumps over the lazy dog. " * 6,
    # Far beyond 256 tokens: both sides truncate to max_seq_length.
    " ".join(f"item{i} waterproof hiking boots, leather, size {i % 13}" for i in range(80)),
]


def _is_loopback(address: object) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX paths and the like stay local
        return True
    try:
        return ipaddress.ip_address(address[0]).is_loopback
    except ValueError:  # a host name: would need DNS, i.e. the network
        return address[0] == "localhost"


@pytest.fixture(scope="module")
def no_network() -> Iterator[None]:
    """Any connection off this machine fails loudly while the models load."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> None:
        if not _is_loopback(address):
            raise AssertionError(f"network access while loading offline: {address!r}")
        return real_connect(self, address)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", guarded)
        yield


@pytest.fixture(scope="module")
def minilm(no_network: None) -> RelevanceModel:
    model = versions.build_model(get_spec("minilm"), seed=0)
    described = versions.load_base_weights(model)  # raises on missing/unexpected keys
    assert "all-MiniLM-L6-v2" in described
    return model.eval()


@pytest.fixture(scope="module")
def reference(no_network: None):
    import huggingface_hub.constants
    from sentence_transformers import SentenceTransformer

    assert huggingface_hub.constants.HF_HUB_OFFLINE, "HF_HUB_OFFLINE was not in effect"
    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    st.eval()
    return st


def _embed(model: RelevanceModel, texts: list[str], max_length: int) -> np.ndarray:
    tok = TextTokenizer(tokenizer_file(), max_length=max_length)(texts)
    with torch.inference_mode():
        out = model.embed(torch.from_numpy(tok.input_ids), torch.from_numpy(tok.attention_mask))
    return out.numpy().astype(np.float64)


def test_minilm_embeddings_match_sentence_transformers(minilm: RelevanceModel, reference) -> None:
    from sentence_transformers.models import Normalize

    # Same inputs on both sides: sentence-transformers truncates at max_seq_length too.
    assert reference.max_seq_length == MAX_LENGTH
    # The shipped modules.json ends in Normalize, so its vectors are unit length as ours are.
    assert isinstance(reference[-1], Normalize)

    tok = TextTokenizer(tokenizer_file(), max_length=MAX_LENGTH)(TEXTS)
    assert tok.input_ids.shape == (len(TEXTS), MAX_LENGTH)
    assert tok.truncated >= 1, "the long text should exercise truncation"
    hf = reference.tokenizer(TEXTS, truncation=True, max_length=MAX_LENGTH)
    for i, text in enumerate(TEXTS):
        ours_ids = tok.input_ids[i][tok.attention_mask[i] == 1].tolist()
        assert ours_ids == hf["input_ids"][i], f"token ids differ for {text[:40]!r}"

    ours = _embed(minilm, TEXTS, MAX_LENGTH)
    theirs = reference.encode(
        TEXTS, convert_to_numpy=True, normalize_embeddings=False, batch_size=len(TEXTS)
    ).astype(np.float64)
    assert ours.shape == theirs.shape == (len(TEXTS), 384)

    cosine = (ours * theirs).sum(1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    )
    worst = int(cosine.argmin())
    assert cosine.min() >= MIN_COSINE, (
        f"min cosine {cosine.min():.8f} for {TEXTS[worst][:40]!r}; all: {np.round(cosine, 8)}"
    )
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_padding_is_masked(minilm: RelevanceModel) -> None:
    """The training length (64) and 256 give the same vectors for texts that fit in 64."""
    at64 = TextTokenizer(tokenizer_file(), max_length=64)
    fits = [t for t in TEXTS if at64([t]).truncated == 0]
    assert len(fits) >= 8
    np.testing.assert_allclose(
        _embed(minilm, fits, 64), _embed(minilm, fits, MAX_LENGTH), atol=1e-5
    )
    # A text's vector does not depend on what else is in the batch.
    alone = _embed(minilm, fits[:1], MAX_LENGTH)
    np.testing.assert_allclose(alone, _embed(minilm, fits, MAX_LENGTH)[:1], atol=1e-5)


def test_fingerprints_differ_and_are_stable() -> None:
    tiny, minilm = get_spec("tiny"), get_spec("minilm")
    assert tiny.fingerprint() != minilm.fingerprint()
    assert minilm.fingerprint() == get_spec("minilm").fingerprint()
    assert len(minilm.fingerprint()) == 16


def test_base_weights_fill_every_encoder_parameter(minilm: RelevanceModel) -> None:
    """load_base_weights raised on neither missing nor unexpected keys (the fixture), and
    every encoder tensor really is the checkpoint's."""
    hf = load_file(str(minilm_dir() / "model.safetensors"))
    used = {k: v for k, v in hf.items() if not k.startswith(BertEncoder.IGNORED_KEYS)}
    state = minilm.encoder.state_dict()
    assert set(state) == set(used)
    for name, tensor in state.items():
        assert torch.equal(tensor, used[name]), name


def test_base_weights_refuse_a_mismatched_encoder() -> None:
    spec = get_spec("minilm")
    deeper = spec.model_copy(
        update={"encoder": spec.encoder.model_copy(update={"num_hidden_layers": 7})}
    )
    with pytest.raises(BadInputError, match="missing"):
        versions.load_base_weights(versions.build_model(deeper, seed=0))
