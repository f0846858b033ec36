"""The checkpoint manager: interval saves, keep-last-K, commit markers, safe loading.

The manager owns the policy, so a training loop only offers each step
(torchtitan style): :meth:`CheckpointManager.save` decides whether the step is due
(every ``every`` steps, never the last one, whose result is the published model
version) and purges stale checkpoints after a save; :meth:`CheckpointManager.load`
picks the step to resume from (``-1``: the newest one that verifies, corrupt or partial
ones skipped with a warning).

A checkpoint directory holds ``model.safetensors`` (weights), ``state.pt`` (optimizer,
LR schedule, RNG states: plain tensors and containers, loaded with
``torch.load(weights_only=True)`` so nothing in the store runs as code) and
``meta.json`` (step, data position, config hash). ``COMMIT`` is written last and lists
the checksums; a directory without a valid one does not exist as far as loading goes.
Tensors are saved from CPU, so a checkpoint written on any backend loads on any other.

A sharded run (``parallelism`` fsdp or hsdp) checkpoints with the same protocol
(:meth:`CheckpointManager.save_sharded`): every rank writes its shards of the weights
and optimizer state through ``torch.distributed.checkpoint`` into the store
(:mod:`embedfresh.ml.parallel.store_dcp`: ``rank-NNNNN.distcp`` and ``dcp-metadata.json``
in place of ``model.safetensors``), rank 0 then writes ``state.pt`` (schedule, RNG
states, the optimizer's hyperparameters) and ``meta.json``, and last the ``COMMIT`` that
lists every rank's files with size and sha256. Loading such a checkpoint
(:meth:`CheckpointManager.read_shards`) reshards through DCP: a run of another world
size resumes from it.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step-(\d{8})")
WEIGHTS = "model.safetensors"
STATE = "state.pt"
META = "meta.json"
#: ``meta.json``'s ``format`` of a checkpoint whose weights and optimizer state are shards
#: (``torch.distributed.checkpoint``); absent: whole weights in ``model.safetensors``.
SHARDED = "dcp"


@dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint as read: ``weights`` is None for a sharded one, whose
    shards load into the sharded model itself (:meth:`CheckpointManager.read_shards`)."""

    step: int
    weights: dict[str, torch.Tensor] | None
    state: dict[str, Any]
    meta: dict[str, Any]
    url: str

    @property
    def sharded(self) -> bool:
        return self.meta.get("format") == SHARDED


def cpu_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies of the weights (device-agnostic, safetensors-ready)."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}


def weights_bytes(weights: dict[str, torch.Tensor]) -> bytes:
    return save_safetensors({k: v.contiguous() for k, v in weights.items()})


def load_weights_bytes(data: bytes) -> dict[str, torch.Tensor]:
    return load_safetensors(data)


def to_cpu(obj: Any) -> Any:
    """Recursively move tensors to CPU (optimizer state from an accelerator)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


class CheckpointManager:
    """Owns one run's checkpoints: where, how often, how many kept, which one loads.

    :param keep_last: committed checkpoints kept after a save (>= 1); older ones are
        purged, never the one just written.
    :param config_hash: identifies model config, hyperparameters and data; a checkpoint
        with another hash belongs to another job and is refused, not silently reused.
    :param every: save interval in steps (``TrainConfig.checkpoint_every``); ``None``
        makes every :meth:`save` call due (explicit saves).
    """

    def __init__(
        self,
        store: ArtifactStore,
        model: str,
        run_id: str,
        keep_last: int,
        config_hash: str,
        every: int | None = None,
    ) -> None:
        if keep_last < 1:
            raise BadInputError("keep_last must be >= 1")
        if every is not None and every < 1:
            raise BadInputError("checkpoint_every must be >= 1")
        self.store = store
        self.model = model
        self.run_id = run_id
        self.keep_last = keep_last
        self.config_hash = config_hash
        self.every = every
        self.directory = layout.checkpoints(model, run_id)

    def due(self, step: int, last_step: bool = False) -> bool:
        """Whether :meth:`save` would write ``step``: a multiple of ``every`` (any step
        when ``every`` is None), and not the run's last step. Every rank of a data
        parallel run may ask, before gathering what a save needs."""
        if last_step:  # the last step's weights are the model version the run publishes
            return False
        return self.every is None or step % self.every == 0

    def _steps(self) -> list[int]:
        steps = []
        for name in self.store.listdir(self.directory):
            m = _STEP_DIR.fullmatch(name)
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def committed_steps(self) -> list[int]:
        rel = lambda s: layout.checkpoint(self.model, self.run_id, s)  # noqa: E731
        return [s for s in self._steps() if self.store.exists(f"{rel(s)}/{markers.COMMIT}")]

    def save(
        self,
        step: int,
        weights: dict[str, torch.Tensor],
        state: dict[str, Any],
        meta: dict[str, Any],
        *,
        last_step: bool = False,
        force: bool = False,
    ) -> str | None:
        """Write the checkpoint of ``step`` if it is :meth:`due`, commit it, then purge
        stale ones (keep-last-K among those up to ``step``). Returns its URL, or None
        when the step is not due (nothing written).

        ``force``: write it even off the interval (the step a SIGTERM stopped training
        at); never the last step. It is a checkpoint like any other: committed the same
        way, loaded by :meth:`load`, and counted and purged by the same keep-last-K.

        ``weights`` are CPU tensors (:func:`cpu_state_dict`); ``state`` (optimizer,
        schedule, RNG) is moved to CPU here; ``meta`` is stored as ``meta.json`` with
        ``step`` and ``config_hash`` added.
        """
        if not (self.due(step, last_step) or (force and not last_step)):
            return None
        directory = layout.checkpoint(self.model, self.run_id, step)
        files = {WEIGHTS: weights_bytes(weights), **self._state_files(step, state, meta)}
        # An earlier attempt may have died half-way through this very step: its marker
        # never got written, so overwriting its files is safe.
        markers.publish(
            self.store, directory, files, meta={"step": step, "config_hash": self.config_hash}
        )
        self._purge(keep_from=step)
        return self.store.url(directory)

    def _state_files(
        self, step: int, state: dict[str, Any], meta: dict[str, Any]
    ) -> dict[str, bytes]:
        """``state.pt`` (moved to CPU) and ``meta.json`` (``step`` and ``config_hash``
        added) of a checkpoint, as bytes."""
        buf = io.BytesIO()
        torch.save(to_cpu(state), buf)
        meta = {**meta, "step": step, "config_hash": self.config_hash}
        return {STATE: buf.getvalue(), META: json.dumps(meta, sort_keys=True).encode()}

    def save_sharded(
        self,
        step: int,
        shards: dict[str, Any],
        state: dict[str, Any],
        meta: dict[str, Any],
        *,
        rank: int,
        gather: Callable[[Any], list[Any]],
        last_step: bool = False,
        force: bool = False,
    ) -> str | None:
        """:meth:`save` for a sharded run; every rank calls it with the same step.

        Every rank writes its ``shards`` (the sharded weights and optimizer state: DTensors,
        tensors only) with ``torch.distributed.checkpoint`` into the checkpoint's folder;
        once all have, rank 0 writes ``state`` and ``meta`` (``format`` added) and then
        the ``COMMIT`` marker listing every file of every rank, then purges stale
        checkpoints. Returns the URL on rank 0, None on the others and when not due.
        """
        if not (self.due(step, last_step) or (force and not last_step)):
            return None
        import torch.distributed.checkpoint as dcp  # noqa: PLC0415 - sharded runs only

        from embedfresh.ml.parallel.store_dcp import StoreWriter  # noqa: PLC0415

        directory = layout.checkpoint(self.model, self.run_id, step)
        # An earlier attempt that died in this very step left no marker: overwriting is safe.
        writer = StoreWriter(self.store, directory)
        dcp.save(shards, storage_writer=writer)
        listing = gather(writer.files)  # every rank's files, once every rank wrote them
        if rank != 0:
            return None
        shards_written = {name: entry for files in listing for name, entry in files.items()}
        markers.publish(
            self.store,
            directory,
            self._state_files(step, state, {**meta, "format": SHARDED}),
            meta={"step": step, "config_hash": self.config_hash},
            written=shards_written,
        )
        self._purge(keep_from=step)
        return self.store.url(directory)

    def read_shards(self, checkpoint: Checkpoint, shards: dict[str, Any]) -> None:
        """Load a sharded checkpoint into ``shards`` in place (the state dicts of this
        run's sharded model and optimizer, DTensors of this run's mesh, which may differ
        from the one that saved it: DCP reshards). Every rank calls it."""
        import torch.distributed.checkpoint as dcp  # noqa: PLC0415 - sharded runs only

        from embedfresh.ml.parallel.store_dcp import StoreReader  # noqa: PLC0415

        directory = layout.checkpoint(self.model, self.run_id, checkpoint.step)
        dcp.load(shards, storage_reader=StoreReader(self.store, directory))

    def latest_meta(self) -> dict[str, Any] | None:
        """``meta.json`` of the newest committed checkpoint (not verified), or None: how a
        run tells, before its first write, which kind of checkpoint it would resume."""
        for step in reversed(self.committed_steps()):
            rel = f"{layout.checkpoint(self.model, self.run_id, step)}/{META}"
            try:
                return {**json.loads(self.store.read_bytes(rel)), "url": self.store.url(rel)}
            except (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError):
                continue
        return None

    def _purge(self, keep_from: int) -> None:
        # Count only checkpoints up to the one just saved: a newer one left by an earlier
        # attempt (skipped as corrupt on resume) must not push the fresh one out.
        committed = [s for s in self.committed_steps() if s <= keep_from]
        keep = set(committed[-self.keep_last :])
        for step in self._steps():
            if step in keep or step > keep_from:
                continue
            directory = layout.checkpoint(self.model, self.run_id, step)
            # Marker first: a crash mid-purge leaves an uncommitted (ignored) directory.
            self.store.remove(f"{directory}/{markers.COMMIT}")
            self.store.remove(directory, recursive=True)

    def load(self, step: int = -1) -> Checkpoint | None:
        """The checkpoint to resume from. ``step=-1``: the newest committed one that
        verifies, corrupt or unreadable ones skipped with a warning; None when there is
        none. ``step >= 0``: exactly that one.

        :raises BadInputError: the checkpoint belongs to another config, or the given
            ``step`` has no committed checkpoint that verifies.
        """
        if step >= 0:
            checkpoint = self._read(step) if step in self.committed_steps() else None
            if checkpoint is None:
                url = self.store.url(layout.checkpoint(self.model, self.run_id, step))
                raise BadInputError(f"no valid committed checkpoint at {url}")
            return checkpoint
        for committed in reversed(self.committed_steps()):
            checkpoint = self._read(committed)
            if checkpoint is not None:
                return checkpoint
        return None

    def load_latest(self) -> Checkpoint | None:
        """``load(step=-1)``: the newest checkpoint that verifies, or None."""
        return self.load(-1)

    def _read(self, step: int) -> Checkpoint | None:
        """The committed checkpoint of ``step``; None (with a warning) when it does not
        verify or parse."""
        directory = layout.checkpoint(self.model, self.run_id, step)
        url = self.store.url(directory)
        check = markers.verify(self.store, directory)
        if not check.ok:
            log.warning("skipping corrupt checkpoint %s: %s", url, check.reason)
            return None
        try:
            meta = json.loads(self.store.read_bytes(f"{directory}/{META}"))
            weights = None  # a sharded checkpoint's load into the sharded model
            if meta.get("format") != SHARDED:
                weights = load_weights_bytes(self.store.read_bytes(f"{directory}/{WEIGHTS}"))
            state = torch.load(
                io.BytesIO(self.store.read_bytes(f"{directory}/{STATE}")),
                map_location="cpu",
                weights_only=True,
            )
        except Exception as e:  # checksums matched but the content does not parse
            log.warning("skipping unreadable checkpoint %s: %s", url, e)
            return None
        if meta.get("config_hash") != self.config_hash:
            raise BadInputError(
                f"checkpoint {url} was written by another configuration "
                f"(config hash {meta.get('config_hash')}, this run {self.config_hash}): "
                "model config, hyperparameters or data changed under the same run id; "
                "start a new run id"
            )
        return Checkpoint(step=step, weights=weights, state=state, meta=meta, url=url)
