"""Accelerator backends behind one small interface; see :class:`Backend`."""

from jobs.backends.base import Backend, get_backend

__all__ = ["Backend", "get_backend"]
