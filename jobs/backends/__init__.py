"""Accelerator backends behind one small interface; see :class:`Backend`."""

from jobs.backends.base import Backend, detect, get_backend

__all__ = ["Backend", "detect", "get_backend"]
