"""The training data of one data interval as fixed-shape tensors, and which rows each
step of each rank trains on.

The order is a pure function of (seed, epoch, step), never of what ran before, so a
resumed attempt replays exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from embedfresh.ml.data.reader import Examples
from embedfresh.ml.model.tokenizer import TextTokenizer, trim_padding


@dataclass(frozen=True)
class TrainingSet:
    """Pre-tokenised, fixed-shape tensors of one data interval."""

    query_ids: torch.Tensor
    query_mask: torch.Tensor
    product_ids: torch.Tensor
    product_mask: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def build(cls, examples: Examples, tokenizer: TextTokenizer) -> TrainingSet:
        q, p = tokenizer.query(examples.queries), tokenizer.document(examples.products)
        return cls(
            torch.from_numpy(q.input_ids),
            torch.from_numpy(q.attention_mask),
            torch.from_numpy(p.input_ids),
            torch.from_numpy(p.attention_mask),
            torch.from_numpy(examples.features),
            torch.from_numpy(examples.labels),
        )

    def batch(self, index: np.ndarray, trim: bool = False) -> dict[str, torch.Tensor]:
        """The rows ``index`` of every tensor, keyed as the training step reads them;
        ``trim``: queries and products each cut to the batch's longest text
        (:func:`~embedfresh.ml.model.tokenizer.trim_padding`), else ``max_length`` wide."""
        i = torch.from_numpy(index)
        texts = {}
        for side in ("query", "product"):
            ids, mask = getattr(self, f"{side}_ids")[i], getattr(self, f"{side}_mask")[i]
            if trim:
                ids, mask = map(torch.from_numpy, trim_padding(ids.numpy(), mask.numpy()))
            texts[f"{side}_ids"], texts[f"{side}_mask"] = ids, mask
        return {**texts, "features": self.features[i], "labels": self.labels[i]}


class RankBatches:
    """This rank's host batches of steps ``first..total``, in order: step ``s`` takes
    the rank's shard of the global batch at its position in the epoch order. Iterable
    more than once and sized, as a data loader (and ``MpDeviceLoader``) expects.
    ``trim``: each batch at its own longest texts (eager backends), else every batch
    ``max_length`` wide (static shapes)."""

    def __init__(
        self,
        data: TrainingSet,
        seed: int,
        per_epoch: int,
        batch_size: int,
        rank: int,
        world_size: int,
        first: int,
        total: int,
        trim: bool = False,
    ) -> None:
        self.data, self.seed, self.per_epoch, self.batch_size = data, seed, per_epoch, batch_size
        self.rank, self.world_size, self.first, self.total = rank, world_size, first, total
        self.trim = trim

    def __len__(self) -> int:
        return self.total - self.first

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order, order_epoch = None, -1
        for step in range(self.first, self.total):
            epoch, position = divmod(step, self.per_epoch)
            if epoch != order_epoch:
                order, order_epoch = epoch_order(self.seed, epoch, len(self.data.labels)), epoch
            start = (position * self.world_size + self.rank) * self.batch_size
            yield self.data.batch(order[start : start + self.batch_size], self.trim)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of an epoch: a pure function of (seed, epoch), so resuming at
    any step replays exactly the batches an uninterrupted run would see."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def data_fingerprint(examples: Examples) -> str:
    """16 hex digits of sha256 over the examples' ids, features, labels and kind, and
    their texts where a corpus gave them (it may change between attempts): part of the
    config hash, so a checkpoint is never resumed on other data."""
    h = hashlib.sha256()
    for arr in (examples.query_ids, examples.product_ids, examples.features, examples.labels):
        h.update(np.ascontiguousarray(arr).tobytes())
    if examples.kind != "binary":  # the objective (binary data: hashed as before kinds)
        h.update(examples.kind.encode())
    if examples.texts_from_corpus:
        h.update("\x00".join(examples.queries + examples.products).encode())
    return h.hexdigest()[:16]
