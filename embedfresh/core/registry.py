"""The model registry: ``models/{model}/registry.json``, the live release + history.

The production pointer names a release (:mod:`embedfresh.core.releases`: the model
version with its corpora's embedding sets and index tables) and moves only through
:meth:`Registry.release` (a run's gated release, or a person's "promote anyway" with a
reason: the one exception to "only PASS releases") and :meth:`Registry.rollback` (back to
an earlier release retention keeps, by a person), all through one compare-and-swap on the
registry's version tag (a conditional PUT on S3, a locked check-and-rename on disk), so
two concurrent writers can never both win and a failed run never touches it. Before it
moves, every file of the release's model version is verified, streamed, against the
sizes and sha256 of its COMMIT marker (:func:`embedfresh.core.markers.verify`): a damaged
version never becomes production. A move that is already done (the same run's release,
a rollback to the live release) writes nothing and says so, so a retried task succeeds.
A registry that does not parse is an error, never silently reset.

Each production entry and history entry records the ``version`` and the ``release``;
entries written before releases existed have a version only, and read as a bare pointer
(:attr:`embedfresh.core.releases.Release.legacy`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.storage import ArtifactStore, json_bytes

log = logging.getLogger(__name__)

#: :meth:`Registry.release` and :meth:`Registry.rollback` check nothing for an
#: expectation left at this.
ANY = object()

PROMOTE = "promote"
ROLLBACK = "rollback"
PROMOTE_ANYWAY = "promote_anyway"

#: What each action is called in messages ("cannot <verb> <model> version <v>").
_VERBS = {PROMOTE: "promote", PROMOTE_ANYWAY: "promote", ROLLBACK: "roll back to"}


class Release(Protocol):
    """What the registry needs of a release (:class:`embedfresh.core.releases.Release`)."""

    release: str | None
    version: str
    url: str | None
    corpora: Mapping[str, Any]


def release_history(registry_doc: dict[str, Any] | None) -> list[str]:
    """Release ids in the order they last went live, the live one first."""
    if not registry_doc:
        return []
    order: list[str] = []
    current = (registry_doc.get("production") or {}).get("release")
    if current:
        order.append(current)
    for entry in reversed(registry_doc.get("history") or []):
        release_id = entry.get("release") if isinstance(entry, dict) else None
        if isinstance(release_id, str) and release_id not in order:
            order.append(release_id)
    return order


def kept_releases(registry_doc: dict[str, Any] | None, keep: int) -> list[str]:
    """The ``keep`` releases retention keeps: the live one and the most recent before it.
    Rollback reaches only these; garbage collection deletes nothing they reference."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    return release_history(registry_doc)[:keep]


@dataclass(frozen=True)
class Move:
    """What a move of the production pointer did."""

    doc: dict[str, Any]
    """The registry document after the move (as read, when nothing was written)."""
    already: bool
    """True when the move was already done: nothing was verified or written."""
    previous: str | None
    """The version the target replaced as production (when ``already``: as recorded by
    the move that did it; None for entries written before moves recorded it)."""
    verification: markers.Verification | None = None
    """The target version's check against its COMMIT marker (None when ``already``)."""

    @property
    def version(self) -> str:
        return self.doc["production"]["version"]

    @property
    def release(self) -> str | None:
        return self.doc["production"].get("release")

    @property
    def previous_release(self) -> str | None:
        return self.doc["production"].get("previous_release")

    def summary(self, registry_url: str) -> dict[str, Any]:
        """What a job that moved (or found moved) the pointer reports."""
        check = self.verification
        return {
            "production": self.version,
            "release": self.release,
            "previous_release": self.previous_release,
            "previous": self.previous,
            "already": self.already,
            "registry": registry_url,
            "verified": None if check is None else {"files": check.files, "bytes": check.bytes},
        }


class Registry:
    def __init__(self, store: ArtifactStore, model: str) -> None:
        self.store = store
        self.model = model
        self.rel = layout.registry(model)

    @property
    def url(self) -> str:
        return self.store.url(self.rel)

    def read(self) -> tuple[dict[str, Any] | None, str | None]:
        """The registry document and its version tag; (None, None) before the first promotion.

        :raises BadInputError: the file exists but is not a valid registry.
        """
        return self._load()

    def _load(self) -> tuple[dict[str, Any] | None, str | None]:
        etag = self.store.etag(self.rel)
        if etag is None:
            return None, None
        raw = self.store.read_bytes(self.rel)
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadInputError(
                f"registry {self.url} is corrupted ({e}); it is never reset automatically: "
                "restore it from its history or backups"
            ) from e
        production = doc.get("production") if isinstance(doc, dict) else None
        if (
            not isinstance(doc, dict)
            or doc.get("model") != self.model
            or not isinstance(doc.get("history"), list)
            or (production is not None and not isinstance(production, dict))
            or (isinstance(production, dict) and not isinstance(production.get("version"), str))
        ):
            raise BadInputError(
                f"registry {self.url} does not have the registry structure "
                "(model, production.version, history); refusing to use or overwrite it"
            )
        return doc, etag

    def production_version(self) -> str | None:
        doc, _ = self.read()
        if doc is None or doc.get("production") is None:
            return None
        return doc["production"]["version"]

    def release(
        self,
        release: Release,
        *,
        action: str = PROMOTE,
        details: dict[str, Any],
        expected_version: str | None | object = ANY,
        expected_release: str | None | object = ANY,
    ) -> Move:
        """Make ``release`` live: the one way a new release (or a first version) goes live.

        ``action`` is :data:`PROMOTE` (after the gate's PASS: the compare-and-swap
        expects production to still be ``expected_version``, the version the gate
        decided against, and the live release to be ``expected_release``, the one the
        search check compared with; :data:`ANY` checks nothing) or
        :data:`PROMOTE_ANYWAY` (a person's override, with ``details["who"]`` and
        ``["why"]``: the one exception to "only PASS releases"; refused when the
        release is live already). Idempotent for the run that did it: the release live
        by this ``details["run_id"]`` and ``action`` writes nothing and says ``already``.

        :raises ConflictError: production moved since the caller read it (another run
            released first, or won the compare-and-swap); nothing was written.
        :raises BadInputError: the version is not committed, or one of its files does not
            match its COMMIT marker (named); nothing was written.
        """
        settled, allowed = self._release_rules(
            release.release, action, details.get("run_id"), expected_version, expected_release
        )
        return self._move(action, release, details, settled, allowed)

    def check_release(
        self,
        release_id: str,
        version: str,
        *,
        action: str = PROMOTE,
        run_id: str | None,
        expected_version: str | None | object = ANY,
        expected_release: str | None | object = ANY,
    ) -> bool:
        """What :meth:`release` would refuse, checked before anything is written (the
        release document is written before the move): the same rules, and the version
        committed. Its files are verified by the move itself. True when the release is
        live already by this run (the move will write nothing).

        :raises ConflictError: production moved since the caller read it.
        :raises BadInputError: the version is not committed, or the override is moot.
        """
        settled, allowed = self._release_rules(
            release_id, action, run_id, expected_version, expected_release
        )
        doc, _ = self.read()
        production = (doc or {}).get("production") or {}
        if settled(production):
            return True
        allowed(doc, production)
        directory = layout.model_version(self.model, version)
        if markers.read_marker(self.store, directory) is None:
            raise BadInputError(
                f"cannot {_VERBS[action]} {self.model} version {version}: "
                f"{self.store.url(directory)} is not committed"
            )
        return False

    def _release_rules(
        self,
        release_id: str | None,
        action: str,
        run_id: str | None,
        expected_version: str | None | object,
        expected_release: str | None | object,
    ) -> tuple[
        Callable[[dict[str, Any]], bool], Callable[[dict[str, Any] | None, dict[str, Any]], None]
    ]:
        """``settled`` and ``allowed`` of a release's move (see :meth:`_move`)."""
        if action not in (PROMOTE, PROMOTE_ANYWAY):
            raise ValueError(f"a release goes live by promote or promote_anyway, not {action!r}")

        def settled(production: dict[str, Any]) -> bool:
            return (
                run_id is not None
                and production.get("release") == release_id
                and production.get("run_id") == run_id
                and production.get("action", PROMOTE) == action
            )

        def allowed(doc: dict[str, Any] | None, current: dict[str, Any]) -> None:
            if action == PROMOTE_ANYWAY:
                if current.get("release") is not None and current.get("release") == release_id:
                    raise BadInputError(
                        f"cannot promote {self.model} release {release_id} anyway: it is "
                        f"live already (registry {self.url}); nothing to override"
                    )
                return
            for key, expected in (("version", expected_version), ("release", expected_release)):
                if expected is not ANY and current.get(key) != expected:
                    raise ConflictError(
                        f"registry {self.url}: production {key} is {current.get(key)!r}, "
                        f"expected {expected!r}; another run released first"
                    )

        return settled, allowed

    def check_kept(self, doc: dict[str, Any] | None, release_id: str | None, keep: int) -> None:
        """A rollback to ``release_id`` is allowed by retention: it is one of the ``keep``
        releases kept, and not the live one.

        :raises BadInputError: it is not (the message names those that are kept).
        """
        current = (doc or {}).get("production") or {}
        if doc is None or not current:
            raise BadInputError(
                f"cannot roll {self.model} back to {release_id}: {self.url} has no "
                "production yet, so there is nothing to roll back"
            )
        kept = kept_releases(doc, keep)
        if release_id != current.get("release") and release_id not in kept[1:]:
            raise BadInputError(
                f"cannot roll {self.model} back to release {release_id}: retention keeps the "
                f"last {keep} releases (registry {self.url}; live "
                f"{current.get('release') or current.get('version')!r}; kept before it, most "
                f"recent first: {', '.join(kept[1:]) or 'none'})"
            )

    def rollback(
        self, release: Release, who: str, why: str, details: dict[str, Any], keep: int
    ) -> Move:
        """Make ``release``, an earlier release still kept, live again: its model, its
        embedding sets and its index tables together.

        Recorded in the history as ``action: rollback`` with ``who``, ``why``, the
        previous release and the time. A rollback to the live release writes nothing
        and says ``already``.

        :raises BadInputError: ``release`` is not among the ``keep`` releases retention
            keeps (the message names those that are), or its version is not committed or
            damaged; nothing was written.
        :raises ConflictError: production moved while the rollback was checking.
        """

        def settled(production: dict[str, Any]) -> bool:
            return production.get("release") == release.release

        def allowed(doc: dict[str, Any] | None, current: dict[str, Any]) -> None:
            self.check_kept(doc, release.release, keep)

        moved = {**details, "who": who, "why": why}
        return self._move(ROLLBACK, release, moved, settled, allowed)

    def _move(
        self,
        action: str,
        release: Release,
        details: dict[str, Any],
        settled: Callable[[dict[str, Any]], bool],
        allowed: Callable[[dict[str, Any] | None, dict[str, Any]], None],
    ) -> Move:
        """The one way the pointer moves: read, check, verify, compare-and-swap.

        ``settled(production)`` says the move is already done (nothing is written);
        ``allowed(doc, production)`` raises when the move must not happen. The release's
        model version is verified, streamed, between the read and the conditional write,
        whose version tag is the one read: if the registry changed meanwhile the write
        fails (unless what changed it already did this move).
        """
        doc, etag = self.read()
        production = (doc or {}).get("production") or {}
        current = production.get("version")
        if settled(production):
            return Move(doc=doc, already=True, previous=production.get("previous"))
        allowed(doc, production)
        version = release.version
        directory = layout.model_version(self.model, version)
        url = self.store.url(directory)
        verb = _VERBS[action]
        if markers.read_marker(self.store, directory) is None:
            raise BadInputError(
                f"cannot {verb} {self.model} version {version}: {url} is not committed"
            )
        check = markers.verify(self.store, directory)
        if not check.ok:
            where = f"{url}/{check.file}" if check.file else url
            raise BadInputError(
                f"cannot {verb} {self.model} version {version}: {where} is damaged: "
                f"{check.reason}; production stays {current!r}"
            )
        log.info(
            "verified %s: %d files, %d bytes match their COMMIT marker",
            url,
            check.files,
            check.bytes,
        )
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        moved = {
            **details,
            "action": action,
            "version": version,
            "release": release.release,
            "release_url": release.url,
            "corpora": sorted(release.corpora),
            "previous": current,
            "previous_release": production.get("release"),
        }
        new_doc = {
            "model": self.model,
            "production": {**moved, "promoted_at": now},
            "history": [*(doc or {}).get("history", []), {**moved, "promoted_at": now}],
        }
        try:
            self.store.write_if_match(self.rel, json_bytes(new_doc), etag)
        except ConflictError:
            # Lost the swap. To whom? The same move done meanwhile (this run's other
            # attempt, or this very write whose answer was lost and whose retried
            # conditional PUT found it done) is success; anything else is a conflict.
            again, _ = self._load()
            production = (again or {}).get("production") or {}
            if settled(production):
                return Move(doc=again, already=True, previous=production.get("previous"))
            raise
        return Move(doc=new_doc, already=False, previous=current, verification=check)
