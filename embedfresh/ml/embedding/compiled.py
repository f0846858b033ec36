"""The compiled embed forward (``EmbedConfig.compile=true``): the encoder's padded
inference forward through ``torch.compile`` (inductor), static shapes.

Length bucketing with ``static_batches`` gives every batch of a bucket the same
``[rows, length]``, so the encoder compiles to one graph per bucket length. The graphs go
into the compile cache under their own key (:func:`key_parts`: the model version's
weights and tokenizer, the buckets' shapes, the dtype, the backend, the CPU's flags and
the code generators' versions), as the train job's do: the first task that embeds with a
key compiles and stores the entry, every later task, array child and re-run restores it
and compiles nothing (inductor's FX graph cache hits; the embed report's
``graph_cache``).

Inductor's ``freezing`` (weights folded in as constants and prepacked for oneDNN) is
off: on cpu it bypasses the FX graph cache (torch 2.9), so every process would pay the
cold compile again, and on the benchmark's host it did not pay for that
(docs/BENCHMARKS.md, "The compiled embed forward").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from embedfresh.core import markers
from embedfresh.core.layout import compile_cache
from embedfresh.ml.compile import torch_cache
from embedfresh.ml.compile.key import cpu_flags_digest, digest, library_versions
from embedfresh.ml.embedding.bucketing import rows_per_batch

if TYPE_CHECKING:
    from torch import nn

    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.backends import Backend

log = logging.getLogger("embedfresh.jobs.embed")

MODE = "embed-inductor"
"""The compile mode the entry is stored under (its key says it; train's are ``torch``)."""


def key_parts(
    weights: str,
    backend: Backend,
    lengths: Sequence[int],
    token_budget: int,
    dtype: str,
) -> dict[str, Any]:
    """Everything the embed graphs depend on. ``weights``: the model version's digest
    (its commit marker's checksums); ``dtype``: the encoder's (``quantize``)."""
    return {
        "mode": MODE,
        "weights": weights,
        "shapes": [[rows_per_batch(n, token_budget), n] for n in lengths],
        "dtype": dtype,
        "backend": backend.name,
        "autocast": str(torch.get_autocast_dtype("cuda"))
        if backend.device.type == "cuda"
        else None,
        "versions": library_versions(),
        **({"cpu_flags": cpu_flags_digest()} if backend.device.type == "cpu" else {}),
    }


class CompiledEncoder:
    """The encoder's forward compiled once, its cache entry restored before and stored
    after the first batches. Call :meth:`store_entry` once the job's first shard is done
    (every graph of that shard's buckets compiled); a later shard with a new bucket
    compiles it then (counted)."""

    def __init__(
        self, model: nn.Module, backend: Backend, store: ArtifactStore, parts: dict[str, Any]
    ) -> None:
        self.backend, self.store = backend, store
        self.key = digest(parts)
        self.parts = parts
        self.cache = torch_cache.restore(store, backend.device.type, self.key)
        if not self.cache["hit"]:  # compiled here: only this job's graphs go in the entry
            self.cache["inductor_dir"] = torch_cache.fresh_inductor_dir()
        self.forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = backend.compile(
            model.embed
        )
        self.stored = self.cache["hit"]

    def store_entry(self) -> None:
        """Publish this process's compiled graphs as the key's entry (a miss only; an
        entry another task published first is kept: same key, same graphs)."""
        if self.stored:
            return
        self.stored = True
        rel = compile_cache(self.backend.device.type, self.key)
        if markers.verify(self.store, rel).ok:
            return
        files = torch_cache.collect(self.cache["inductor_dir"])
        markers.publish(self.store, rel, files, meta={"key_parts": self.parts})
        log.info(
            "compiled embed graphs stored as compile-cache entry %s (%d bytes)",
            self.store.url(rel),
            sum(len(v) for v in files.values()),
        )

    def report(self) -> dict[str, Any]:
        return {
            # Measured (bench/reproducible.py): byte-equal across processes on cpu; on
            # cuda inductor's timed kernel choice differed between two processes.
            "byte_equal_across_processes": self.backend.device.type == "cpu",
            "key": self.key,
            "hit": self.cache["hit"],
            "url": self.cache["url"],
            "graphs": self.backend.compiles(),
            "graph_cache": self.backend.graph_cache(),
        }
