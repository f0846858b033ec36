"""Ahead-of-time compilation of the training graphs into the shared compile cache."""

from __future__ import annotations

from embedfresh.operators.train import IncrementalTrainingOperator


class AheadOfTimeCompileOperator(IncrementalTrainingOperator):
    """Traces and compiles every training graph before training (``python -m embedfresh.jobs.compile``).

    Runs a short trial of the real training command (a few steps, one evaluation, one
    checkpoint save into a throw-away run) and stores what it compiled under
    ``compile-cache/<backend>/<key>/`` in the artifact store, ``key`` hashing the model
    config, shapes, backend, compiler flags and library versions. A key already in the
    cache is a hit and the task finishes in seconds.

    Per backend: cpu/cuda store torch.compile's caches (or report "eager" when the
    config trains eagerly); xla reports how many graphs the trial traced; neuron runs
    the trial under ``neuron_parallel_compile`` with ``NEURON_CC_FLAGS`` and
    ``NEURON_COMPILE_CACHE_URL`` pointing into the artifact store (``s3://`` in
    production), the same two variables the training job then uses.

    Takes the training operator's arguments (data interval, epochs, ``job_settings``,
    ``nproc_per_node``): give it the training task's, so the trial compiles the graphs
    that task will run. The job runs under the same launch as training (torchrun with
    ``nproc_per_node`` > 1: the trial trains data parallel, global rank 0 alone writes)
    and the cache key holds the launch's world size, so a train of another world size
    does not find this entry.
    Trial settings (``trial_steps``, ``neuron_max_retries``, ...) go in ``job_settings``.

    Writes ``runs/<model>/<run_id>/reports/compile.json``; the XCom value is the job's
    small summary (key, cache hit, mode, graphs).
    """

    job_name = "compile"
    ui_color = "#fdf2e9"
