"""Neuron's compile environment and ``neuron_parallel_compile``'s summary.

One function builds ``NEURON_CC_FLAGS`` and ``NEURON_COMPILE_CACHE_URL`` for both the
compile job's trial and the real training run, so the run finds every graph the trial
compiled.
"""

from __future__ import annotations

import re
from typing import Any

from embedfresh.core import layout
from embedfresh.core.config import TrainConfig
from embedfresh.core.storage import ArtifactStore


def cache_root(cfg: TrainConfig) -> ArtifactStore:
    """The store holding the compile cache (``compile_cache_root`` or the artifact root)."""
    return ArtifactStore(cfg.compile_cache_root or cfg.artifact_root)


def neuron_env(cfg: TrainConfig) -> dict[str, str]:
    """``NEURON_CC_FLAGS`` and ``NEURON_COMPILE_CACHE_URL`` (a plain path for a file://
    root, the s3:// URL otherwise) of a run with ``cfg``."""
    store = cache_root(cfg)
    rel = layout.compile_cache_backend("neuron")
    url = store.path(rel) if store.protocol == "file" else store.url(rel)
    return {"NEURON_CC_FLAGS": cfg.neuron_cc_flags, "NEURON_COMPILE_CACHE_URL": url}


# neuron_parallel_compile ends with (its log_summary), e.g.
#   2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total graphs: 22
#   ... ||PARALLEL_COMPILE||: Total successful compilations: 22
#   ... ||PARALLEL_COMPILE||: Total failed compilations: 0
_SUMMARY = {
    "graphs": re.compile(r"Total graphs:\s*(\d+)"),
    "succeeded": re.compile(r"Total successful compilations:\s*(\d+)"),
    "failed": re.compile(r"Total failed compilations:\s*(\d+)"),
}


def parse_summary(output: str) -> dict[str, Any] | None:
    """``{"graphs", "succeeded", "failed"}`` from the tool's output (the last summary when
    it printed several, e.g. one per node), or None when it printed none."""
    found: dict[str, Any] = {}
    for name, pattern in _SUMMARY.items():
        values = pattern.findall(output)
        if values:
            found[name] = int(values[-1])
    return found if "graphs" in found else None
