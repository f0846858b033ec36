"""The model registry: ``models/{model}/registry.json``, production pointer + history.

The pointer moves only through :meth:`Registry.promote`, a compare-and-swap on the
previous production version (a conditional PUT on S3, a locked check-and-rename on
disk), so two concurrent runs can never both win and a failed run never touches it.
A registry that does not parse is an error, never silently reset.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.storage import ArtifactStore, json_bytes


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

    def promote(
        self, version: str, expected_previous: str | None, decision: dict[str, Any]
    ) -> dict[str, Any]:
        """Point production at ``version`` if production is still ``expected_previous``.

        :raises ConflictError: production moved since the caller read it (a concurrent
            run promoted first); nothing was written.
        :raises BadInputError: ``version`` is not a committed model version.
        """
        if markers.read_marker(self.store, layout.model_version(self.model, version)) is None:
            raise BadInputError(
                f"cannot promote {self.model} version {version}: "
                f"{self.store.url(layout.model_version(self.model, version))} is not committed"
            )
        doc, etag = self.read()
        current = None if doc is None else (doc.get("production") or {}).get("version")
        if current != expected_previous:
            raise ConflictError(
                f"registry {self.url}: production is {current!r}, expected "
                f"{expected_previous!r}; another run promoted first"
            )
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        entry = {"version": version, "previous": current, "promoted_at": now, **decision}
        new_doc = {
            "model": self.model,
            "production": {"version": version, "promoted_at": now, **decision},
            "history": [*(doc or {}).get("history", []), entry],
        }
        self.store.write_if_match(self.rel, json_bytes(new_doc), etag)
        return new_doc
