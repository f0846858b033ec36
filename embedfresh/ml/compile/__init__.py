"""Ahead-of-time compilation: ``python -m embedfresh.jobs.compile`` (:mod:`embedfresh.jobs.compile`) and
the pieces the train job shares with it: which mode a run compiles in
(:mod:`~embedfresh.ml.compile.modes`), the cache key (:mod:`~embedfresh.ml.compile.key`, fed with
the launch's world size, :mod:`~embedfresh.ml.compile.launch`), the torch.compile
cache entry (:mod:`~embedfresh.ml.compile.torch_cache`) and Neuron's environment
(:mod:`~embedfresh.ml.compile.neuron`)."""

from embedfresh.ml.compile.key import cache_key
from embedfresh.ml.compile.modes import resolve_backend, resolve_mode
from embedfresh.ml.compile.neuron import neuron_env

__all__ = ["cache_key", "neuron_env", "resolve_backend", "resolve_mode"]
