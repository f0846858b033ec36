"""Ahead-of-time compilation: ``python -m jobs.compile`` (:mod:`jobs.compile.job`) and
the pieces the train job shares with it: which mode a run compiles in
(:mod:`~jobs.compile.modes`), the cache key (:mod:`~jobs.compile.key`), the torch.compile
cache entry (:mod:`~jobs.compile.torch_cache`) and Neuron's environment
(:mod:`~jobs.compile.neuron`)."""

from jobs.compile.key import cache_key
from jobs.compile.modes import resolve_backend, resolve_mode
from jobs.compile.neuron import neuron_env

__all__ = ["cache_key", "neuron_env", "resolve_backend", "resolve_mode"]
