"""The compile-cache key: what, if it changed, would make cached graphs wrong or unused.

It hashes the model config (architecture), the batch shape and sequence length of the
training and evaluation steps, what else changes the traced program (contrastive term,
dropout, the launch's world size and the parallelism: with several ranks the model
runs under DDP, whose graphs dynamo splits at the gradient buckets), the backend, the compile mode and flags, the versions of
every library that generates code (python, torch, torch-xla, Neuron's), and on the cpu
backend the CPU's feature flags (its kernels are built for this CPU).

The compile job and the train job both call :func:`cache_key` / :func:`key_parts` with
the world size of the launch they run under (:func:`launch_world_size`; the DAG starts
both with the same ``nproc_per_node``), so a compile under ``torchrun --nproc-per-node
2`` fills the entry a train under the same launch restores, and a one-process train
looks for another entry.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from importlib import metadata
from typing import Any

from embedfresh.core import cpuinfo
from embedfresh.core.config import TrainConfig
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.compile.launch import launch_world_size
from embedfresh.ml.model import versions

#: Distributions whose version changes generated code, where installed.
_LIBRARIES = ("torch", "torch-xla", "torch-neuronx", "neuronx-cc", "triton")


def library_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "machine": platform.machine()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


#: /proc/cpuinfo flags that name instruction-set extensions ``-march=native`` can turn on
#: (not ``hypervisor``, bug or power-management flags, which differ between identical CPUs).
_ISA_FLAG_PREFIXES = (
    "avx", "sse", "ssse", "fma", "f16c", "bmi", "amx", "vpclmul", "pclmul", "vaes", "aes",
    "gfni", "adx", "popcnt", "movbe", "lzcnt", "abm", "sha", "clwb", "clflushopt", "xsave",
    "serialize", "waitpkg", "movdir", "rdrand", "rdseed", "prefetchw", "cx16", "asimd",
    "sve", "fp", "atomics", "dotprod", "bf16", "i8mm",
)  # fmt: skip


def cpu_flags_digest() -> str:
    """A short digest of this CPU's instruction-set flags (``/proc/cpuinfo``), "" where
    there are none to read. On the cpu backend inductor builds its kernels with
    ``-march=native`` and keys them by that option, not by what it resolved to: an entry
    built on a CPU with instructions this one lacks (AVX512-FP16, AMX) would load and
    fault."""
    flags = sorted(
        {f for f in cpuinfo.field("flags", "Features").split() if f.startswith(_ISA_FLAG_PREFIXES)}
    )
    return hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12] if flags else ""


def key_parts(
    cfg: TrainConfig,
    backend: str,
    mode: str,
    *,
    world_size: int | None = None,
    parallelism: str | None = None,
) -> dict[str, Any]:
    """Everything the key hashes, as the compile report shows it.

    :param world_size: ranks of the run; None: this process's launch
        (:func:`launch_world_size`), what both jobs pass.
    :param parallelism: how the ranks split the model (ddp replicas, fsdp or hsdp
        shards: other graphs); None: the config's ``parallelism``, what both jobs pass.
    """
    if world_size is None:
        world_size = launch_world_size()
    if parallelism is None:
        parallelism = cfg.parallelism
    store = ArtifactStore(cfg.artifact_root)
    spec, _ = versions.training_spec(store, cfg.model, cfg.dataset, cfg.features)
    return {
        "model": cfg.model,
        "model_fingerprint": spec.fingerprint(),
        "batch_shape": [cfg.batch_size or spec.default_batch_size, spec.max_length],
        "sequence_length": spec.max_length,
        "eval_batch_size": cfg.eval_batch_size,
        "contrastive": cfg.contrastive_weight > 0,
        "dropout": cfg.dropout,
        "world_size": world_size,
        "parallelism": parallelism,
        "backend": backend,
        "mode": mode,
        "flags": cfg.neuron_cc_flags if backend == "neuron" else "dynamic=False",
        "versions": library_versions(),
        **({"cpu_flags": cpu_flags_digest()} if backend == "cpu" else {}),
    }


def cache_key(
    cfg: TrainConfig,
    backend: str,
    mode: str,
    *,
    world_size: int | None = None,
    parallelism: str | None = None,
) -> str:
    """The compile-cache key of a run: short hex digest of :func:`key_parts`."""
    return digest(key_parts(cfg, backend, mode, world_size=world_size, parallelism=parallelism))


def digest(parts: dict[str, Any]) -> str:
    """A compile-cache key: short hex digest of everything the graphs depend on."""
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
