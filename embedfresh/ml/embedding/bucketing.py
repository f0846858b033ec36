"""Length bucketing: texts grouped by token length into a small fixed set of padded
lengths, batches filled up to a padded-token budget.

Each shard is tokenised once without padding (truncated at the max length), each text
goes to the smallest padded length that holds it, and a bucket of padded length ``L``
is cut into batches of ``token_budget // L`` rows. With ``static`` every batch of a
bucket is padded to that row count (dummy rows with an all-zero mask), so the number
of distinct input shapes is the number of lengths: what XLA/Neuron/torch.compile want.
Work is per shard, so memory is bounded by the shard size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from embedfresh.core.exit_codes import BadInputError


def padded_lengths(requested: Sequence[int], max_length: int) -> tuple[int, ...]:
    """The requested lengths up to ``max_length``, with ``max_length`` always included."""
    kept = sorted({n for n in requested if n < max_length})
    return (*kept, max_length)


class VariableTokenizer:
    """WordPiece tokenisation without padding, truncated at ``max_length`` tokens."""

    def __init__(self, tokenizer_json: bytes, max_length: int) -> None:
        self._tok = Tokenizer.from_str(tokenizer_json.decode())
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=max_length)
        self.max_length = max_length

    def __call__(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Token ids per text, and how many texts were truncated."""
        if not texts:
            return [], 0
        try:
            encodings = self._tok.encode_batch(list(texts))
        except TypeError as e:
            raise BadInputError(f"texts must be strings: {e}") from e
        truncated = sum(1 for e in encodings if e.overflowing)
        return [e.ids for e in encodings], truncated


@dataclass(frozen=True)
class Batch:
    """One model call: ``input_ids``/``attention_mask`` [rows, length]; ``index`` holds
    the shard positions of the first ``len(index)`` rows (the rest is padding)."""

    length: int
    input_ids: np.ndarray
    attention_mask: np.ndarray
    index: np.ndarray

    @property
    def real(self) -> int:
        return len(self.index)


@dataclass(frozen=True)
class Plan:
    batches: list[Batch]
    real_tokens: int
    padded_tokens: int


def rows_per_batch(length: int, token_budget: int) -> int:
    rows = token_budget // length
    if rows < 1:
        raise BadInputError(
            f"token_budget {token_budget} is smaller than the padded length {length}: "
            "raise token_budget or lower max_length"
        )
    return rows


def make_batches(
    token_ids: Sequence[Sequence[int]],
    lengths: Sequence[int],
    token_budget: int,
    static: bool = True,
) -> Plan:
    """Group texts by length into batches of fixed padded length under the budget."""
    lengths = tuple(sorted(lengths))
    n_tokens = np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=len(token_ids))
    if len(n_tokens) and n_tokens.max() > lengths[-1]:
        raise ValueError(f"a text has {n_tokens.max()} tokens, above the max {lengths[-1]}")
    bucket = np.searchsorted(np.asarray(lengths), n_tokens, side="left")
    batches: list[Batch] = []
    padded = 0
    for b, length in enumerate(lengths):
        members = np.flatnonzero(bucket == b)
        if not len(members):
            continue
        rows = rows_per_batch(length, token_budget)
        for start in range(0, len(members), rows):
            index = members[start : start + rows]
            height = rows if static else len(index)
            ids = np.zeros((height, length), dtype=np.int64)
            mask = np.zeros((height, length), dtype=np.int64)
            for row, pos in enumerate(index):
                t = token_ids[pos]
                ids[row, : len(t)] = t
                mask[row, : len(t)] = 1
            batches.append(Batch(length, ids, mask, index))
            padded += height * length
    return Plan(batches, int(n_tokens.sum()), padded)
