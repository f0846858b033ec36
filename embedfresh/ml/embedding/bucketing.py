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

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from embedfresh.core.exit_codes import BadInputError


def padded_lengths(requested: Sequence[int], max_length: int) -> tuple[int, ...]:
    """The requested lengths up to ``max_length``, with ``max_length`` always included."""
    kept = sorted({n for n in requested if n < max_length})
    return (*kept, max_length)


class TokenIds(Sequence[np.ndarray]):
    """Token ids of many texts in one flat ``int32`` array: ``self[i]`` is text ``i``'s
    ids (a view; a slice gives a list of them), :attr:`lengths` their counts. Two arrays
    a shard instead of a Python list of ints per text (~36 bytes a token as Python ints
    and list slots, plus the tokenizer's ``Encoding`` objects of the whole shard)."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        self.flat = flat
        self.offsets = offsets
        self.lengths = np.diff(offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"text {i} of {len(self)}")
        i %= len(self)
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self.flat[a:b] for a, b in itertools.pairwise(self.offsets))


TOKENIZE_CHUNK = 1024
"""Texts tokenised at once: each chunk's encodings (ids, offsets, token strings, the
overflow of a cut text) are freed before the next is made."""


class VariableTokenizer:
    """WordPiece tokenisation without padding, truncated at ``max_length`` tokens."""

    def __init__(self, tokenizer_json: bytes, max_length: int) -> None:
        self._tok = Tokenizer.from_str(tokenizer_json.decode())
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=max_length)
        self.max_length = max_length

    def __call__(self, texts: Sequence[str]) -> tuple[TokenIds, int]:
        """Token ids per text, and how many texts were truncated."""
        pieces: list[np.ndarray] = []
        lengths = np.zeros(len(texts) + 1, dtype=np.int64)
        truncated = 0
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            chunk = list(texts[start : start + TOKENIZE_CHUNK])
            try:
                encodings = self._tok.encode_batch(chunk)
            except TypeError as e:
                raise BadInputError(f"texts must be strings: {e}") from e
            truncated += sum(1 for e in encodings if e.overflowing)
            ids = [e.ids for e in encodings]
            del encodings
            lengths[start + 1 : start + 1 + len(ids)] = [len(t) for t in ids]
            pieces.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32))
        flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        return TokenIds(flat, np.cumsum(lengths)), truncated


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
    if isinstance(token_ids, TokenIds):
        n_tokens = token_ids.lengths
    else:
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
