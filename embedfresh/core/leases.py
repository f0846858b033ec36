"""Leases: one holder at a time for a unit of work (a run's train, evaluate, gate or
promote; an embed task's shards).

A lease is a small JSON object in the store, ``runs/{model}/{run_id}/leases/{unit}.json``,
naming its holder (host, pid, start), its last heartbeat and its expiry. It is taken and
renewed by compare-and-swap (a conditional PUT on S3, a locked check-and-rename on disk),
so of two starts of one unit exactly one holds it. The other exits 75 (transient) naming
the holder: Airflow's and Batch's retries keep trying, and take the lease over once the
holder is provably gone (same host, its pid no longer exists) or its lease has expired
(no heartbeat for ``EMBEDFRESH_LEASE_SECONDS``, 120 s by default). A holder renews its
lease from a thread every third of that time; a holder that finds its lease taken over
stops at once with exit 75 and writes nothing more. Taking a lease over deletes nothing:
the new holder resumes from what is committed.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from embedfresh.core import layout
from embedfresh.core.exit_codes import ConflictError, ExitCode, TransientError
from embedfresh.core.storage import ArtifactStore, json_bytes
from embedfresh.core.storage.local import pid_alive

log = logging.getLogger(__name__)

LEASE_SECONDS = "EMBEDFRESH_LEASE_SECONDS"
DEFAULT_SECONDS = 120.0


def lease_seconds() -> float:
    raw = os.environ.get(LEASE_SECONDS, "")
    try:
        seconds = float(raw) if raw else DEFAULT_SECONDS
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{LEASE_SECONDS}={raw!r} is not a positive number of seconds")
    return seconds


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")


def live_holders(store: ArtifactStore, model: str, run_id: str) -> list[dict[str, Any]]:
    """The leases of run ``run_id`` whose holders may still be working (not expired, not
    provably gone): a run that is writing. Garbage collection leaves its outputs alone."""
    directory = f"{layout.run_dir(model, run_id)}/leases"
    now = time.time()
    held = []
    for name in store.listdir(directory):
        doc = Lease._read(store, f"{directory}/{name}")
        if doc and Lease._gone(doc, now) is None:
            held.append(doc)
    return held


class Lease:
    """A held lease; :meth:`acquire` takes one, :meth:`release` gives it back."""

    def __init__(self, store: ArtifactStore, rel: str, doc: dict[str, Any], seconds: float):
        self.store, self.rel, self.doc, self.seconds = store, rel, doc, seconds
        self._etag = store.etag(rel)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.store.url(self.rel)

    @classmethod
    def acquire(
        cls, store: ArtifactStore, model: str, run_id: str, unit: str, seconds: float | None = None
    ) -> Lease:
        """Take the unit's lease, or take it over from a holder that is gone.

        :raises TransientError: a live holder has it (exit 75: retry later).
        """
        seconds = lease_seconds() if seconds is None else seconds
        rel = f"{layout.run_dir(model, run_id)}/leases/{layout.safe_id(unit, 'lease unit')}.json"
        now = time.time()
        doc = {
            "unit": unit,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": _iso(now),
            "heartbeat_at": _iso(now),
            "expires": now + seconds,
        }
        etag = store.etag(rel)
        if etag is not None:
            held = cls._read(store, rel)
            why = cls._gone(held, now)
            if why is None:
                raise TransientError(cls._held_message(store.url(rel), held, now))
            log.warning("taking over %s from %s", store.url(rel), why)
            doc["took_over_from"] = {k: held.get(k) for k in ("host", "pid", "started_at")}
        try:
            store.write_if_match(rel, json_bytes(doc), etag)
        except ConflictError:  # another start took it between our read and our write
            held = cls._read(store, rel)
            raise TransientError(cls._held_message(store.url(rel), held, time.time())) from None
        lease = cls(store, rel, doc, seconds)
        lease._start_heartbeat()
        log.info("lease %s held (renewed every %.0f s)", lease.url, seconds / 3)
        return lease

    @staticmethod
    def _read(store: ArtifactStore, rel: str) -> dict[str, Any]:
        try:
            doc = json.loads(store.read_bytes(rel))
        except (FileNotFoundError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    @staticmethod
    def _gone(held: dict[str, Any], now: float) -> str | None:
        """Why the holder of ``held`` is gone, or None while it may still be working."""
        holder = f"{held.get('host')} pid {held.get('pid')}"
        expires = held.get("expires")
        if not isinstance(expires, (int, float)):
            return f"an unreadable lease ({holder})"
        if now > expires:
            return f"{holder}, whose lease expired at {_iso(expires)}"
        pid = held.get("pid")
        if held.get("host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
            return f"{holder}, which no longer runs on this host"
        return None

    @staticmethod
    def _held_message(url: str, held: dict[str, Any], now: float) -> str:
        expires = held.get("expires")
        left = f"{expires - now:.0f} s" if isinstance(expires, (int, float)) else "?"
        return (
            f"this unit of work is held by {held.get('host')} pid {held.get('pid')} since "
            f"{held.get('started_at')} (last heartbeat {held.get('heartbeat_at')}, expires in "
            f"{left}; lease {url}): a retry takes it over once that holder is gone"
        )

    # -- heartbeat -------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.renew()
            except ConflictError:
                log.error("lease %s was taken over: stopping without another write", self.url)
                os._exit(int(ExitCode.TRANSIENT))
            except Exception as e:  # storage unreachable: keep trying until it expires
                if time.time() > self.doc["expires"]:
                    log.error("lease %s expired while unrenewable (%s): stopping", self.url, e)
                    os._exit(int(ExitCode.TRANSIENT))
                log.warning("lease %s not renewed (%s); trying again", self.url, e)

    def renew(self) -> None:
        """Push the expiry forward, if the lease is still ours.

        :raises ConflictError: another holder took it over.
        """
        now = time.time()
        doc = {**self.doc, "heartbeat_at": _iso(now), "expires": now + self.seconds}
        self.store.write_if_match(self.rel, json_bytes(doc), self._etag)
        self.doc, self._etag = doc, self.store.etag(self.rel)

    def release(self) -> None:
        """Stop the heartbeat and remove the lease, if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.store.etag(self.rel) == self._etag:
            self.store.remove(self.rel)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
