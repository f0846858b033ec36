"""``torch.distributed.checkpoint`` (DCP) over the artifact store: a
:class:`~torch.distributed.checkpoint.StorageWriter` and a
:class:`~torch.distributed.checkpoint.StorageReader` of our own, through DCP's public
interfaces, so a sharded checkpoint goes wherever the store goes (``file://``, ``s3://``)
and every object it writes is one write of :class:`ArtifactStore` (a fault point of the
reliability suite, like any other).

Layout of one checkpoint folder, as DCP's planners lay out the state:

- ``rank-00000.distcp``, ``rank-00001.distcp``, ...: each rank's shards, one object per
  rank, the raw bytes of each tensor chunk back to back (no pickle: dtype and shape are
  in the metadata);
- ``dcp-metadata.json``: DCP's :class:`~torch.distributed.checkpoint.Metadata` (every
  tensor's global size and chunks, and where each chunk's bytes are), written by the
  coordinator once every rank's object is written, as JSON.

Nothing here is unpickled: a checkpoint holds tensors only (the optimizer's hyper-
parameters travel in the checkpoint's ``state.pt``, loaded with ``weights_only``), and a
writer or reader asked for a pickled object (DCP's ``BYTE_IO`` items) refuses it.

Resharding is DCP's: a reader of another world size asks, through its planner, for the
parts of the stored chunks its own shards cover (:func:`_narrow`), so a checkpoint saved
by 4 ranks loads into 2.

Each writer records what it wrote (:attr:`StoreWriter.files`: name -> (sha256, size)):
the checkpoint's ``COMMIT`` marker, written by rank 0 after every rank's objects, lists
every file with them (:mod:`embedfresh.ml.parallel.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from typing import Any

import torch
from torch.distributed.checkpoint import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    LoadPlan,
    LoadPlanner,
    Metadata,
    SavePlan,
    SavePlanner,
    StorageReader,
    StorageWriter,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore

#: The coordinator's object: DCP's metadata as JSON.
METADATA = "dcp-metadata.json"
#: Format of :data:`METADATA`; a reader refuses another.
FORMAT = 1


def rank_file(rank: int) -> str:
    """The object holding rank ``rank``'s shards."""
    return f"rank-{rank:05d}.distcp"


@dataclasses.dataclass(frozen=True)
class ChunkLocation:
    """Where one stored chunk's bytes are: ``length`` bytes at ``start`` of ``file``, a
    C-contiguous tensor of ``dtype`` and ``shape``."""

    file: str
    start: int
    length: int
    dtype: str
    shape: tuple[int, ...]


class StoreWriter(StorageWriter):
    """DCP's writer into ``directory`` of ``store``: each rank writes its chunks as one
    object (:func:`rank_file`), the coordinator then writes :data:`METADATA`."""

    def __init__(self, store: ArtifactStore, directory: str) -> None:
        super().__init__()
        self.store, self.directory = store, directory
        self.is_coordinator = False
        #: name -> (sha256, size) of every object this rank wrote.
        self.files: dict[str, tuple[str, int]] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.files = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # The coordinator names each rank's object: plan i is global rank i's.
        return [
            dataclasses.replace(plan, storage_data=rank_file(i)) for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        name = plan.storage_data
        buffer = io.BytesIO()
        results = []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                raise ValueError(
                    f"{item.index.fqn}: a sharded checkpoint holds tensors only (a pickled "
                    "object would be unpickled as code when loaded)"
                )
            tensor = planner.resolve_data(item)
            chunk = tensor.detach().to("cpu").contiguous()
            data = _tensor_bytes(chunk)
            start = buffer.tell()
            buffer.write(data)
            where = ChunkLocation(
                name, start, len(data), _dtype_name(chunk.dtype), tuple(chunk.shape)
            )
            results.append(
                WriteResult(index=item.index, size_in_bytes=len(data), storage_data=where)
            )
        self._write(name, buffer.getvalue())
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        self._write(METADATA, json.dumps(_metadata_json(metadata), sort_keys=True).encode())

    def _write(self, name: str, data: bytes) -> None:
        self.store.write_bytes(f"{self.directory}/{name}", data)
        self.files[name] = (hashlib.sha256(data).hexdigest(), len(data))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never chosen by DCP itself: the manager builds it for a folder


class StoreReader(StorageReader):
    """DCP's reader of a checkpoint folder :class:`StoreWriter` wrote; each rank reads
    the byte ranges of the chunks its own shards need, streamed, nothing else."""

    def __init__(self, store: ArtifactStore, directory: str) -> None:
        super().__init__()
        self.store, self.directory = store, directory
        self.locations: dict[MetadataIndex, ChunkLocation] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.locations = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        url = self.store.url(f"{self.directory}/{METADATA}")
        try:
            doc = json.loads(self.store.read_bytes(f"{self.directory}/{METADATA}"))
            return _metadata_from_json(doc)
        except (KeyError, TypeError, ValueError) as e:
            raise BadInputError(f"{url} is not a sharded checkpoint's metadata: {e}") from e

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.locations = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, list[Any]] = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                raise BadInputError(
                    f"{self.store.url(self.directory)} asks to unpickle {item.storage_index.fqn}: "
                    "a sharded checkpoint holds tensors only; refused"
                )
            by_file.setdefault(self.locations[item.storage_index].file, []).append(item)
        for name, items in by_file.items():
            items.sort(key=lambda it: self.locations[it.storage_index].start)
            with self.store.open_read(f"{self.directory}/{name}") as f:
                for item in items:
                    where = self.locations[item.storage_index]
                    f.seek(where.start)
                    stored = _tensor_from(f.read(where.length), where)
                    chunk = _narrow(stored, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.shape != chunk.shape:
                        raise BadInputError(
                            f"{item.dest_index.fqn}: stored chunk {tuple(chunk.shape)} does "
                            f"not fit the shard {tuple(target.shape)}"
                        )
                    target.copy_(chunk)
                    planner.commit_tensor(item, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A C-contiguous CPU tensor's raw bytes (any dtype: viewed as bytes, not converted)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensor_from(data: bytes, where: ChunkLocation) -> torch.Tensor:
    if len(data) != where.length:
        raise BadInputError(
            f"{where.file}: {len(data)} bytes at {where.start}, {where.length} listed"
        )
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(_dtype(where.dtype)).reshape(where.shape)


def _narrow(tensor: torch.Tensor, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    """The part of a stored chunk a reader's shard covers (``offsets``/``lengths`` are
    relative to the chunk, per dimension)."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        tensor = tensor.narrow(dim, offset, length)
    return tensor


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


# -- DCP's Metadata as JSON ---------------------------------------------------------


def _metadata_json(metadata: Metadata) -> dict[str, Any]:
    tensors, objects = {}, []
    for fqn, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            objects.append(fqn)
            continue
        tensors[fqn] = {
            "dtype": _dtype_name(entry.properties.dtype),
            "size": list(entry.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in entry.chunks],
        }
    locations = [
        {
            "fqn": index.fqn,
            "offset": None if index.offset is None else list(index.offset),
            "index": index.index,
            **dataclasses.asdict(where),
        }
        for index, where in metadata.storage_data.items()
    ]
    mappings = metadata.planner_data or {}
    return {
        "format": FORMAT,
        "version": metadata.version,
        "tensors": tensors,
        "objects": objects,
        "locations": locations,
        # DefaultSavePlanner's flattening: flat key -> the path in the nested state dict.
        "planner_data": {key: list(path) for key, path in mappings.items()},
    }


def _metadata_from_json(doc: dict[str, Any]) -> Metadata:
    if doc.get("format") != FORMAT:
        raise ValueError(f"format {doc.get('format')!r}, this reader reads {FORMAT}")
    entries: dict[str, Any] = {
        fqn: TensorStorageMetadata(
            properties=TensorProperties(dtype=_dtype(t["dtype"])),
            size=torch.Size(t["size"]),
            chunks=[
                ChunkStorageMetadata(offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"]))
                for c in t["chunks"]
            ],
        )
        for fqn, t in doc["tensors"].items()
    }
    entries.update({fqn: BytesStorageMetadata() for fqn in doc["objects"]})
    locations = {
        MetadataIndex(
            fqn=loc["fqn"],
            offset=None if loc["offset"] is None else torch.Size(loc["offset"]),
            index=loc["index"],
        ): ChunkLocation(
            loc["file"], loc["start"], loc["length"], loc["dtype"], tuple(loc["shape"])
        )
        for loc in doc["locations"]
    }
    return Metadata(
        state_dict_metadata=entries,
        planner_data={key: tuple(path) for key, path in doc["planner_data"].items()},
        storage_data=locations,
        version=doc.get("version"),
    )
