"""Ids repeated across corpus shards, found in memory bounded independently of the corpus.

:class:`CrossShardIds` takes each shard's ids as it is read and appends them, with the
shard's index, to one of :data:`PARTITIONS` Arrow IPC files in a temporary directory
(the partition is a hash of the id, so every copy of an id lands in the same file).
:meth:`CrossShardIds.duplicates` then checks one partition at a time; a partition larger
than ``budget_bytes`` on disk is split again with an independent hash (streamed, in
groups of :data:`FLUSH_ROWS` rows) until each piece fits. Memory: one shard's ids plus at
most :data:`FLUSH_ROWS` gathered ids while adding, then one partition of at most
``budget_bytes`` (a few times that while sorting it), whatever the number of rows or
shards; Arrow allocates from the C allocator meanwhile
(:func:`~embedfresh.core.parquet.system_memory_pool`). Disk:
about the id column's bytes plus 4 bytes a row (int64 ids: ~13 GB at a billion rows,
split twice), under ``TMPDIR`` unless told otherwise, removed by
:meth:`CrossShardIds.close`. Torch-free.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedfresh.core.parquet import system_memory_pool

PARTITIONS = 64
"""Files the ids are hashed into, at each level (a power of two)."""
BUDGET_BYTES = 64 << 10
"""A partition file at most this large is checked in memory; a larger one is split."""
FLUSH_ROWS = 1 << 13
"""Ids gathered (from several small shards, or batches of a split) before they are
scattered to the files: fewer, larger record batches on disk."""
MAX_LEVEL = 6
"""Splits after which a partition is checked whatever its size (64**6 pieces: only a
corpus with one id repeated millions of times gets there)."""

_FNV_PRIME = np.uint64(0x100000001B3)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit reaches every output bit."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _hash(ids: np.ndarray, level: int) -> np.ndarray:
    """A 64-bit hash of each id (int64, or numpy ``str``), independent for each level."""
    seed = np.uint64((0x9E3779B97F4A7C15 * (level + 1)) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        if ids.dtype.kind in "iu":
            return _mix(ids.astype(np.int64).view(np.uint64) + seed)
        # FNV-1a over the code points; the NUL padding of a fixed-width array is skipped,
        # so an id hashes alike in shards whose longest ids differ.
        width = ids.dtype.itemsize // 4
        points = ids.view(np.uint32).reshape(len(ids), width) if width else None
        h = np.full(len(ids), _FNV_OFFSET ^ seed, dtype=np.uint64)
        for c in range(width):
            col = points[:, c].astype(np.uint64)
            h = np.where(col != 0, (h ^ col) * _FNV_PRIME, h)
        return _mix(h)


def _as_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    ids = column.to_numpy(zero_copy_only=False)
    return ids.astype(str) if ids.dtype == object else ids


@dataclass
class Duplicates:
    """What :meth:`CrossShardIds.duplicates` found."""

    count: int = 0
    """Distinct ids that occur more than once."""
    examples: list[Any] = field(default_factory=list)
    """The smallest of them (at most ``examples`` of :meth:`CrossShardIds.duplicates`)."""
    shards: list[int] = field(default_factory=list)
    """The smallest indices of shards holding one of them (at most ``shards``)."""


class CrossShardIds:
    """The ids of a corpus's shards on disk, hash-partitioned, to find repeats.

    Use as a context manager (the directory is removed on exit), :meth:`add` each
    shard's ids (one id type for all: int64 or ``str``; a shard of the other type marks
    the set :attr:`mixed`, is named in :attr:`first_shard`, and is not kept), then call
    :meth:`duplicates` once.

    :param directory: where the temporary directory goes (default: ``TMPDIR``).
    :param budget_bytes: largest partition file checked in memory (bytes).
    :param partitions: files per level (a power of two).
    """

    def __init__(
        self,
        directory: str | None = None,
        *,
        budget_bytes: int = BUDGET_BYTES,
        partitions: int = PARTITIONS,
    ) -> None:
        if partitions < 2 or partitions & (partitions - 1):
            raise ValueError(f"partitions must be a power of two >= 2, got {partitions}")
        self.budget_bytes = budget_bytes
        self.partitions = partitions
        self._bits = partitions.bit_length() - 1
        self._tmp = tempfile.TemporaryDirectory(prefix="embedfresh-ids-", dir=directory)
        self._schema: pa.Schema | None = None
        self._writers: list[tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = []
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0
        self.first_shard: dict[str, int] = {}
        """The first shard added of each id type (``"int64"``, ``"string"``), in the
        order met: a caller names the two shards that disagree."""
        self.rows = 0
        """Ids added."""
        self.splits = 0
        """Partitions that were over the budget and were split (for tests and logs)."""

    @property
    def mixed(self) -> bool:
        """True once shards of both id types were added."""
        return len(self.first_shard) > 1

    def __enter__(self) -> CrossShardIds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the files and remove the directory."""
        self._close_writers()
        self._tmp.cleanup()

    def _close_writers(self) -> None:
        for sink, writer in self._writers:
            writer.close()
            sink.close()
        self._writers = []

    def _partition(self, ids: np.ndarray, level: int) -> np.ndarray:
        return (_hash(ids, level) >> np.uint64(64 - self._bits)).astype(np.int64)

    def _open(self, prefix: str) -> list[tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]]:
        out = []
        for k in range(self.partitions):
            sink = pa.OSFile(os.path.join(self._tmp.name, f"{prefix}{k:02x}"), "wb")
            out.append((sink, pa.ipc.new_stream(sink, self._schema)))
        return out

    def _scatter(self, writers: list, ids: np.ndarray, shards: np.ndarray, level: int) -> None:
        part = self._partition(ids, level)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.partitions + 1))
        id_type = self._schema.field("id").type
        for k in range(self.partitions):
            take = order[bounds[k] : bounds[k + 1]]
            if len(take):
                batch = pa.record_batch(
                    [pa.array(ids[take], id_type), pa.array(shards[take], pa.int32())],
                    schema=self._schema,
                )
                writers[k][1].write_batch(batch)

    def add(self, shard: int, ids: np.ndarray) -> None:
        """Keep one shard's ids (int64 or numpy ``str``) on disk."""
        with system_memory_pool():
            self._add(shard, ids)

    def _add(self, shard: int, ids: np.ndarray) -> None:
        id_type = pa.string() if ids.dtype.kind == "U" else pa.int64()
        self.first_shard.setdefault(str(id_type), shard)
        if self._schema is None:
            self._schema = pa.schema([("id", id_type), ("shard", pa.int32())])
            self._writers = self._open("p")
        elif self._schema.field("id").type != id_type:
            return
        if len(ids):
            self._pending.append((ids, np.full(len(ids), shard, np.int32)))
            self._pending_rows += len(ids)
            self.rows += len(ids)
            if self._pending_rows >= FLUSH_ROWS:
                self._flush()

    def _flush(self) -> None:
        if self._pending:
            ids = np.concatenate([i for i, _ in self._pending])
            shards = np.concatenate([s for _, s in self._pending])
            self._pending, self._pending_rows = [], 0
            self._scatter(self._writers, ids, shards, 0)

    def duplicates(self, *, examples: int = 3, shards: int = 10) -> Duplicates:
        """Ids that occur more than once among everything added (mixed types: none)."""
        found = Duplicates()
        if self._schema is None or self.mixed:
            return found
        with system_memory_pool():
            self._flush()
            self._close_writers()
            for k in range(self.partitions):
                path = os.path.join(self._tmp.name, f"p{k:02x}")
                self._check(path, 1, found, examples, shards)
        return found

    def _check(self, path: str, level: int, found: Duplicates, examples: int, shards: int) -> None:
        size = os.path.getsize(path)
        if size > self.budget_bytes and level <= MAX_LEVEL:
            self.splits += 1
            prefix = f"{os.path.basename(path)}."
            writers = self._open(prefix)
            with pa.OSFile(path, "rb") as source:
                group: list[pa.RecordBatch] = []
                for batch in itertools.chain(pa.ipc.open_stream(source), [None]):
                    if batch is not None:
                        group.append(batch)
                    if group and (batch is None or sum(map(len, group)) >= FLUSH_ROWS):
                        table = pa.Table.from_batches(group).combine_chunks()
                        ids = _as_numpy(table.column(0))
                        self._scatter(writers, ids, table.column(1).to_numpy(), level)
                        group = []
            os.remove(path)
            for sink, writer in writers:
                writer.close()
                sink.close()
            for k in range(self.partitions):
                child = os.path.join(self._tmp.name, f"{prefix}{k:02x}")
                self._check(child, level + 1, found, examples, shards)
            return
        pool = pa.system_memory_pool()
        with pa.OSFile(path, "rb") as source:
            table = pa.ipc.open_stream(source, memory_pool=pool).read_all()
        table = table.combine_chunks(memory_pool=pool)
        os.remove(path)
        if table.num_rows < 2:
            return
        order = pc.sort_indices(table, sort_keys=[("id", "ascending")], memory_pool=pool)
        ids = pc.take(table.column("id"), order, memory_pool=pool).combine_chunks(pool)
        same = pc.equal(ids[1:], ids[:-1], memory_pool=pool).to_numpy(zero_copy_only=False)
        if not same.any():
            return
        repeated = pc.unique(ids[1:].filter(pa.array(same)))
        found.count += len(repeated)
        found.examples = sorted([*found.examples, *repeated[:examples].to_pylist()])[:examples]
        held = np.zeros(len(ids), dtype=bool)
        held[1:] |= same
        held[:-1] |= same
        in_shards = pc.take(table.column("shard"), order).to_numpy()[held]
        found.shards = sorted({*found.shards, *np.unique(in_shards)[:shards].tolist()})[:shards]
