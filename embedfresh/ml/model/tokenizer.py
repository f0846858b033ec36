"""Fixed-length tokenisation with the model's own fast tokenizer (``tokenizers``), and the
trim that lets eager batches run at their own longest text instead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from embedfresh.core.exit_codes import BadInputError


@dataclass(frozen=True)
class Tokenized:
    input_ids: np.ndarray  # int64 [n, max_length]
    attention_mask: np.ndarray  # int64 [n, max_length]
    truncated: int  # texts longer than max_length tokens


class TextTokenizer:
    """Pads and truncates every text to exactly ``max_length`` tokens (static shapes)."""

    def __init__(
        self,
        tokenizer_json: bytes | str | Path,
        max_length: int,
        prompts: dict[str, str] | None = None,
    ) -> None:
        if isinstance(tokenizer_json, bytes):
            self._tok = Tokenizer.from_str(tokenizer_json.decode())
        else:
            self._tok = Tokenizer.from_file(str(tokenizer_json))
        self.max_length = max_length
        #: The model's own prompts (``query``, ``document``): :meth:`query` and
        #: :meth:`document` put them before the texts, as sentence-transformers'
        #: ``encode_query``/``encode_document`` do.
        self.prompts = dict(prompts or {})
        self._tok.enable_truncation(max_length=max_length)
        self._tok.enable_padding(length=max_length, pad_id=0, pad_token="[PAD]")

    def query(self, texts: Sequence[str]) -> Tokenized:
        """Queries, after the model's query prompt (if it has one)."""
        return self(_prompted(self.prompts.get("query", ""), texts))

    def document(self, texts: Sequence[str]) -> Tokenized:
        """Documents (products, corpus texts), after the model's document prompt."""
        return self(_prompted(self.prompts.get("document", ""), texts))

    def __call__(self, texts: Sequence[str]) -> Tokenized:
        if not texts:
            empty = np.zeros((0, self.max_length), dtype=np.int64)
            return Tokenized(empty, empty.copy(), 0)
        try:
            encodings = self._tok.encode_batch(list(texts))
        except TypeError as e:
            raise BadInputError(f"texts must be strings: {e}") from e
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        truncated = sum(1 for e in encodings if e.overflowing)
        return Tokenized(ids, mask, truncated)


PAD_MULTIPLE = 8
"""A trimmed batch's length is rounded up to this many tokens (GEMM-friendly on every
device; a handful of distinct shapes for the allocator and the kernels)."""


def trim_padding(
    input_ids: np.ndarray, attention_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The columns of a padded batch that any row attends, rounded up to
    :data:`PAD_MULTIPLE` (padding side kept: right-padded batches keep their first
    columns, left-padded ones their last). The vectors are those of the full width: padded
    positions are masked out of attention and pooling; only the work and the activation
    memory shrink with the batch's longest text (a search query of 9 tokens no longer runs
    at ``max_length``)."""
    width = attention_mask.shape[1]
    attended = np.flatnonzero(attention_mask.any(axis=0))
    if len(attended) == 0:
        return input_ids, attention_mask
    lo, hi = int(attended[0]), int(attended[-1]) + 1
    keep = min(width, -(-(hi - lo) // PAD_MULTIPLE) * PAD_MULTIPLE)
    start = min(lo, width - keep)  # right padding: 0; left padding: width - keep
    cols = slice(start, start + keep)
    return input_ids[:, cols], attention_mask[:, cols]


def _prompted(prompt: str, texts: Sequence[str]) -> Sequence[str]:
    return [prompt + t for t in texts] if prompt else texts
