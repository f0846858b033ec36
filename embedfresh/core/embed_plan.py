"""The plan of an embed array job: which shards are pending and how they split over children.

An AWS Batch array job starts N copies of one command, each told only its index
(``AWS_BATCH_JOB_ARRAY_INDEX``). The pending shards of a large corpus (up to 10,000 and
more) do not travel in the ``SubmitJob`` request: Batch caps a job's payload at 30 KiB
("Maximum job payload size (for SubmitJob API operations)", AWS Batch service quotas),
the indices 0 to 9,999 as ``--set shards=[...]`` alone are 48 KiB, and after a partial run the pending list is any subset of the
corpus, so no range encoding bounds it (every other shard pending is ``n/2`` ranges).
Instead the operator's planning step writes one small JSON object, the **plan**, to the
artifact store before it submits:

``runs/{model}/{run_id}/plans/{result name}/{attempt id}.json``

keyed to the run and to the task's execution (its result ticket), so a retry writes its
own plan and never reads an earlier try's. Each child gets the plan's path and its
sha256 on its command line (``--set plan=... --set plan_sha256=...``), reads it, checks
it, and embeds slice ``AWS_BATCH_JOB_ARRAY_INDEX`` of it (:func:`plan_slice`: contiguous
and balanced, sizes differ by at most one). A plan is also the record of what a run
decided: the shards reused and recomputed, and why.

Torch-free: the embed job writes and reads plans, the operator reads them back.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore

#: Version of the plan's shape; a child refuses a plan of a newer one.
PLAN_FORMAT = 1

#: AWS Batch's largest array job.
MAX_CHILDREN = 10_000


def plan_path(model: str, run_id: str, name: str, attempt_id: str) -> str:
    """Where the plan of one execution (result name + attempt id) of an embed task lives."""
    return (
        f"{layout.run_dir(model, run_id)}/plans/{layout.safe_id(name, 'result name')}/"
        f"{layout.safe_id(attempt_id, 'attempt id')}.json"
    )


def slice_count(pending: int, max_children: int) -> int:
    """Children an array job of ``pending`` shards gets: ``min(pending, max_children)``.

    :raises ValueError: ``max_children`` outside 1..10,000 (Batch's array limit).
    """
    if not 1 <= max_children <= MAX_CHILDREN:
        raise ValueError(f"max_children must be 1 to {MAX_CHILDREN}, got {max_children}")
    return min(pending, max_children)


def plan_slice(shards: list[int], slices: int, index: int) -> list[int]:
    """Slice ``index`` of ``shards`` cut in ``slices`` contiguous, balanced parts.

    Contiguous keeps a child's shards next to each other in the store (one S3 prefix
    range, one report name); balanced sizes differ by at most one shard.
    """
    n = len(shards)
    return shards[index * n // slices : (index + 1) * n // slices]


@dataclass(frozen=True)
class EmbedPlan:
    """A plan as written to the store."""

    model: str
    version: str
    corpus: str
    run_id: str
    shards: list[int]
    """The pending shards, sorted: not committed, or committed but not current."""
    slices: int
    """Children of the array job (1: a plain job)."""
    reused: list[int]
    """Shards committed and current when planned (left out of :attr:`shards`)."""
    recomputed: list[dict[str, Any]]
    """Pending shards that were committed, with the reason they are redone."""
    created_at: str = ""
    reused_rows: int = 0
    """Rows of the :attr:`reused` shards (their commit markers)."""
    reused_truncated: int = 0
    """Texts cut when the :attr:`reused` shards were embedded (their commit markers)."""

    def to_json(self) -> bytes:
        body = {
            "format": PLAN_FORMAT,
            "kind": "embed-plan",
            "model": self.model,
            "version": self.version,
            "corpus": self.corpus,
            "run_id": self.run_id,
            "shards": self.shards,
            "slices": self.slices,
            "reused": self.reused,
            "recomputed": self.recomputed,
            "reused_rows": self.reused_rows,
            "reused_truncated": self.reused_truncated,
            "created_at": self.created_at or dt.datetime.now(dt.UTC).isoformat(),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def slice(self, index: int) -> list[int]:
        """The shards child ``index`` embeds.

        :raises BadInputError: ``index`` is outside ``0 .. slices - 1``.
        """
        if not 0 <= index < self.slices:
            raise BadInputError(
                f"array index {index} is outside the plan's {self.slices} slice(s) "
                f"(0 to {self.slices - 1}): the array job was submitted with more children "
                "than its plan has slices"
            )
        return plan_slice(self.shards, self.slices, index)


def write_plan(store: ArtifactStore, rel: str, plan: EmbedPlan) -> str:
    """Write ``plan`` at ``rel``; returns its sha256 (what the children check)."""
    data = plan.to_json()
    store.write_bytes(rel, data)
    return hashlib.sha256(data).hexdigest()


def read_plan(store: ArtifactStore, rel: str, sha256: str | None = None) -> EmbedPlan:
    """The plan at ``rel``, checked against ``sha256`` when given.

    :raises BadInputError: missing, not a plan, of a newer format, or not the bytes the
        operator wrote (another sha256).
    """
    url = store.url(rel)
    try:
        data = store.read_bytes(rel)
    except FileNotFoundError:
        raise BadInputError(
            f"embed plan {url} does not exist: the array job must be submitted by the "
            "operator that wrote it"
        ) from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise BadInputError(
            f"embed plan {url} is not the one this job was submitted with "
            f"(sha256 {hashlib.sha256(data).hexdigest()[:12]}..., expected {sha256[:12]}...)"
        )
    try:
        raw = json.loads(data)
        if raw.get("kind") != "embed-plan":
            raise ValueError(f"kind {raw.get('kind')!r}")
        if int(raw["format"]) > PLAN_FORMAT:
            raise BadInputError(
                f"embed plan {url} has format {raw['format']}; this job reads up to "
                f"{PLAN_FORMAT} (the operator is newer than the job's image)"
            )
        plan = EmbedPlan(
            model=str(raw["model"]),
            version=str(raw["version"]),
            corpus=str(raw["corpus"]),
            run_id=str(raw["run_id"]),
            shards=[int(i) for i in raw["shards"]],
            slices=int(raw["slices"]),
            reused=[int(i) for i in raw["reused"]],
            recomputed=list(raw["recomputed"]),
            created_at=str(raw.get("created_at", "")),
            # Absent from plans written before they were counted: 0.
            reused_rows=int(raw.get("reused_rows", 0)),
            reused_truncated=int(raw.get("reused_truncated", 0)),
        )
    except BadInputError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadInputError(f"{url} is not an embed plan: {e}") from None
    if not (1 if plan.shards else 0) <= plan.slices <= len(plan.shards):
        raise BadInputError(
            f"embed plan {url} has {plan.slices} slices for {len(plan.shards)} shards"
        )
    return plan
