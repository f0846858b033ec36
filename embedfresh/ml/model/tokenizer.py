"""Fixed-length tokenisation with the model's WordPiece tokenizer (``tokenizers``)."""

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


def _prompted(prompt: str, texts: Sequence[str]) -> Sequence[str]:
    return [prompt + t for t in texts] if prompt else texts
