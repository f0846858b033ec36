"""Accelerator backends behind one small interface; see :class:`Backend`."""

from embedfresh.ml.backends.base import Backend, detect, get_backend

__all__ = ["Backend", "detect", "get_backend"]
