"""How a training run compiles, per backend and model config.

cpu/cuda: torch.compile or eager, a measured choice (``TrainConfig.compile``); xla: the
graphs torch-xla traces; neuron: the same, compiled ahead of time by
``neuron_parallel_compile``.
"""

from __future__ import annotations

from embedfresh.ml.backends import resolve_name

TORCH_COMPILE = "torch.compile"
EAGER = "eager"
XLA_TRACE = "xla-trace"
NEURON_PARALLEL_COMPILE = "neuron_parallel_compile"

#: ``compile=auto``: torch.compile where it trains faster than eager, per (backend,
#: model), from ``bench/compile.py`` (docs/BENCHMARKS.md, "torch.compile vs eager
#: training on cpu", 2026-11-22, 2 overloaded CPU cores, one thread each): tiny 1.77
#: steps/s compiled vs 2.77 eager (0.64x); minilm 0.073 vs 0.063 (1.15x, one noisy run)
#: for 80 s more to the first step even with the cache restored (328 s on a miss), so a
#: payback only after ~33 steps if real: eager on cpu for both until a quiet re-run.
#: cuda is unmeasured here (no GPU): eager until a measurement says otherwise.
COMPILE_DEFAULTS: dict[tuple[str, str], bool] = {
    ("cpu", "tiny"): False,
    ("cpu", "minilm"): False,
    ("cuda", "tiny"): False,
    ("cuda", "minilm"): False,
}


def resolve_backend(name: str) -> str:
    """The concrete backend ``name`` means here (``auto`` detected), without building it."""
    return resolve_name(name)


def resolve_mode(compile_setting: str, backend: str, model: str, parallelism: str = "ddp") -> str:
    """The compile mode of a run: :data:`TORCH_COMPILE` or :data:`EAGER` on cpu/cuda,
    :data:`XLA_TRACE` on xla, :data:`NEURON_PARALLEL_COMPILE` on neuron. A sharded run
    (``parallelism`` fsdp or hsdp) is eager: its step is not compiled here
    (``compile=on`` with it is refused by the config)."""
    if backend == "xla":
        return XLA_TRACE
    if backend == "neuron":
        return NEURON_PARALLEL_COMPILE
    if parallelism != "ddp":
        return EAGER
    if compile_setting == "on":
        return TORCH_COMPILE
    if compile_setting == "off":
        return EAGER
    return TORCH_COMPILE if COMPILE_DEFAULTS.get((backend, model), False) else EAGER
