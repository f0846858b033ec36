"""The model registry: ``models/{model}/registry.json``, production pointer + history.

The pointer moves only through :meth:`Registry.promote` (a run's gated candidate),
:meth:`Registry.promote_anyway` (a version the gate did not pass, by a person, with a
reason: the one exception to "only PASS promotes") and :meth:`Registry.rollback` (back
to an earlier production version, by a person), all through one compare-and-swap on the registry's version tag (a conditional PUT on S3, a
locked check-and-rename on disk), so two concurrent writers can never both win and a
failed run never touches it. Before it moves, every file of the target version is
verified, streamed, against the sizes and sha256 of its COMMIT marker
(:func:`embedfresh.core.markers.verify`): a damaged version never becomes production.
A move that is already done (the same run's promotion, a rollback to the version in
production) writes nothing and says so, so a retried task succeeds. A registry that
does not parse is an error, never silently reset.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.storage import ArtifactStore, json_bytes

log = logging.getLogger(__name__)

PROMOTE = "promote"
ROLLBACK = "rollback"
PROMOTE_ANYWAY = "promote_anyway"

#: What each action is called in messages ("cannot <verb> <model> version <v>").
_VERBS = {PROMOTE: "promote", PROMOTE_ANYWAY: "promote", ROLLBACK: "roll back to"}


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

    def summary(self, registry_url: str) -> dict[str, Any]:
        """What a job that moved (or found moved) the pointer reports."""
        check = self.verification
        return {
            "production": self.version,
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

    def former_production_versions(self, doc: dict[str, Any] | None = None) -> list[str]:
        """Versions that were production once and are not now, the most recent first."""
        if doc is None:
            doc, _ = self.read()
        if doc is None:
            return []
        current = (doc.get("production") or {}).get("version")
        seen: list[str] = []
        for entry in reversed(doc["history"]):
            version = entry.get("version") if isinstance(entry, dict) else None
            if isinstance(version, str) and version != current and version not in seen:
                seen.append(version)
        return seen

    def promote(
        self, version: str, expected_previous: str | None, decision: dict[str, Any]
    ) -> Move:
        """Point production at ``version`` if production is still ``expected_previous``.

        Idempotent for the run that promoted: when production already is ``version``,
        promoted by this ``decision["run_id"]``, nothing is written and the returned
        move says ``already`` (an orchestrator's retry after a lost worker succeeds).

        :raises ConflictError: production moved since the caller read it (another run
            promoted first, or won the compare-and-swap); nothing was written.
        :raises BadInputError: ``version`` is not committed, or one of its files does not
            match its COMMIT marker (named, with what is wrong); nothing was written.
        """
        run_id = decision.get("run_id")

        def settled(production: dict[str, Any]) -> bool:
            return (
                run_id is not None
                and production.get("version") == version
                and production.get("run_id") == run_id
                and production.get("action", PROMOTE) == PROMOTE
            )

        def allowed(doc: dict[str, Any] | None, current: str | None) -> None:
            if current != expected_previous:
                raise ConflictError(
                    f"registry {self.url}: production is {current!r}, expected "
                    f"{expected_previous!r}; another run promoted first"
                )

        return self._move(PROMOTE, version, decision, settled, allowed)

    def rollback(self, version: str, who: str, why: str, details: dict[str, Any]) -> Move:
        """Point production back at ``version``, an earlier production version.

        Recorded in the history as ``action: rollback`` with ``who``, ``why``, the
        previous version and the time. A rollback to the version in production writes
        nothing and says ``already``.

        :raises BadInputError: ``version`` was never production (the message lists the
            versions that were), is not committed, or is damaged; nothing was written.
        :raises ConflictError: production moved while the rollback was checking.
        """

        def settled(production: dict[str, Any]) -> bool:
            return production.get("version") == version

        def allowed(doc: dict[str, Any] | None, current: str | None) -> None:
            if doc is None or current is None:
                raise BadInputError(
                    f"cannot roll {self.model} back to {version}: {self.url} has no "
                    "production version yet, so there is nothing to roll back"
                )
            former = self.former_production_versions(doc)
            if version not in former:
                raise BadInputError(
                    f"cannot roll {self.model} back to {version}: it was never production "
                    f"(registry {self.url}; production is {current!r}; former production "
                    f"versions, most recent first: {', '.join(former) or 'none'})"
                )

        return self._move(ROLLBACK, version, {**details, "who": who, "why": why}, settled, allowed)

    def promote_anyway(self, version: str, who: str, why: str, details: dict[str, Any]) -> Move:
        """Point production at ``version`` although no gate passed it: a person's override.

        The one exception to "only PASS promotes", so it takes a ``who`` and a ``why``
        and the history records ``action: promote_anyway`` with them, the previous
        version and the time. The version must still be committed and intact (the same
        verification as every move). Idempotent for the run that did it: production
        already ``version`` by this ``details["run_id"]`` writes nothing and says
        ``already``; production already ``version`` by any other move is refused
        (nothing to override).

        :raises BadInputError: ``version`` is production already, not committed, or
            damaged; nothing was written.
        :raises ConflictError: production moved while the override was checking.
        """
        run_id = details.get("run_id")

        def settled(production: dict[str, Any]) -> bool:
            return (
                run_id is not None
                and production.get("version") == version
                and production.get("run_id") == run_id
                and production.get("action") == PROMOTE_ANYWAY
            )

        def allowed(doc: dict[str, Any] | None, current: str | None) -> None:
            if current == version:
                raise BadInputError(
                    f"cannot promote {self.model} version {version} anyway: it already is "
                    f"production (registry {self.url}); nothing to override"
                )

        moved = {**details, "who": who, "why": why}
        return self._move(PROMOTE_ANYWAY, version, moved, settled, allowed)

    def _move(
        self,
        action: str,
        version: str,
        details: dict[str, Any],
        settled: Callable[[dict[str, Any]], bool],
        allowed: Callable[[dict[str, Any] | None, str | None], None],
    ) -> Move:
        """The one way the pointer moves: read, check, verify, compare-and-swap.

        ``settled(production)`` says the move is already done (nothing is written);
        ``allowed(doc, current)`` raises when the move must not happen. The target's
        files are verified, streamed, between the read and the conditional write, whose
        version tag is the one read: if the registry changed meanwhile the write fails
        (unless what changed it already did this move).
        """
        doc, etag = self.read()
        production = (doc or {}).get("production") or {}
        current = production.get("version")
        if settled(production):
            return Move(doc=doc, already=True, previous=production.get("previous"))
        allowed(doc, current)
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
        moved = {**details, "action": action, "version": version, "previous": current}
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
