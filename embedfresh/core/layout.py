"""Where each artifact lives under the store root (DESIGN "Artifact store").

All paths are relative to the root and built here only, so the layout has one owner::

    datasets/{name}/{split}/dt=YYYY-MM-DD/part-00000.parquet   daily training partitions
    datasets/{name}/eval/part-00000.parquet                    the fixed held-out split
    corpora/{name}/part-00000.parquet                          texts to embed (id, text)
    corpora/{name}/changes/{change_set}.parquet                upserts and deletes (op, id, text)
    corpora/{name}/snapshots/{snapshot}/part-00000.parquet     a full snapshot, diffed into one
    compile-cache/{backend}/{key}/...
    runs/{model}/{run_id}/checkpoints/step-00000100/...        + COMMIT written last
    runs/{model}/{run_id}/reports/{kind}.json
    runs/{model}/{run_id}/results/{name}.json                  a job's result record
    runs/{model}/_index.json                                   run index (derived, for the UI)
    models/{model}/versions/{version}/...                      + COMMIT written last
    models/{model}/registry.json                               live release pointer + history
    models/{model}/releases/{release}.json                     a release, immutable
    models/{model}/sync/{release}/{corpus}.json                its table's change sets applied
    models/{model}/sync/{release}/_INDEX.json                  where its tables live now
    embeddings/{model}/{version}/{corpus}/part-*.parquet       + _MANIFEST.json last
"""

from __future__ import annotations

import datetime as dt
import re

from embedfresh.core.exit_codes import BadInputError

# Matched whole (fullmatch): with match() and ``$``, "tiny\n" would pass.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=-]{0,199}")


def safe_id(value: str, what: str) -> str:
    """Validate a name used as one path segment (model, run id, version, dataset)."""
    if not isinstance(value, str) or not _ID.fullmatch(value) or ".." in value:
        raise BadInputError(
            f"invalid {what} {value!r}: use letters, digits and . _ : + = - "
            "(no '/', no '..', at most 200 characters)"
        )
    return value


def dataset_partition(dataset: str, split: str, day: dt.date) -> str:
    return f"datasets/{safe_id(dataset, 'dataset')}/{safe_id(split, 'split')}/dt={day.isoformat()}"


def eval_split(dataset: str) -> str:
    return f"datasets/{safe_id(dataset, 'dataset')}/eval"


def dataset_declaration(dataset: str) -> str:
    """A data set's own declaration: the features its pairs carry (docs/DATA.md)."""
    return f"datasets/{safe_id(dataset, 'dataset')}/dataset.json"


def judgments(dataset: str) -> str:
    """The graded judgments of a data set's eval split (docs/DATA.md)."""
    return f"datasets/{safe_id(dataset, 'dataset')}/judgments"


def corpus(name: str) -> str:
    return f"corpora/{safe_id(name, 'corpus')}"


def corpus_changes(name: str) -> str:
    """A corpus's change sets, one Parquet object each (docs/SEARCH.md "Corpus changes")."""
    return f"{corpus(name)}/changes"


def corpus_snapshot(name: str, snapshot: str) -> str:
    """A full snapshot of a corpus that ``corpus_diff`` turns into a change set."""
    return f"{corpus(name)}/snapshots/{safe_id(snapshot, 'snapshot')}"


def change_set(name: str, change: str) -> str:
    return f"{corpus_changes(name)}/{safe_id(change, 'change set')}.parquet"


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def run_dir(model: str, run_id: str) -> str:
    return f"runs/{safe_id(model, 'model')}/{safe_id(run_id, 'run id')}"


def run_index(model: str) -> str:
    """The model's run index (:mod:`embedfresh.core.run_index`): derived from the reports,
    read by the web UI in one request. Its name starts with ``_``, never a valid run id."""
    return f"runs/{safe_id(model, 'model')}/_index.json"


def checkpoints(model: str, run_id: str) -> str:
    return f"{run_dir(model, run_id)}/checkpoints"


def checkpoint(model: str, run_id: str, step: int) -> str:
    return f"{checkpoints(model, run_id)}/{checkpoint_name(step)}"


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def report(model: str, run_id: str, kind: str) -> str:
    return f"{run_dir(model, run_id)}/reports/{safe_id(kind, 'report kind')}.json"


def eval_step_report(step: int) -> str:
    """Report kind of the evaluation at training step ``step`` (``reports/{kind}.json``)."""
    return f"eval-step-{step:08d}"


def reports(model: str, run_id: str) -> str:
    return f"{run_dir(model, run_id)}/reports"


def gate_chart(model: str, run_id: str, name: str = "gate") -> str:
    """The chart of gate decision ``name`` (``reports/{name}.json``), a Vega-Lite spec
    (:mod:`embedfresh.core.quality_chart`)."""
    return f"{reports(model, run_id)}/{safe_id(name, 'report kind')}.vl.json"


def costs(model: str, run_id: str) -> str:
    """The run's cost records (:mod:`embedfresh.core.cost`): one per job execution."""
    return f"{reports(model, run_id)}/cost"


def cost(model: str, run_id: str, name: str, attempt_id: str) -> str:
    """The cost record of one execution: the task instance's result ``name`` and the
    execution's attempt id, so a retry's record never replaces its failed try's."""
    return (
        f"{costs(model, run_id)}/{safe_id(name, 'result name')}/"
        f"{safe_id(attempt_id, 'attempt id')}.json"
    )


def results(model: str, run_id: str) -> str:
    """The run's result records: one per successful job execution (:mod:`embedfresh.core.results`)."""
    return f"{run_dir(model, run_id)}/results"


def result(model: str, run_id: str, name: str) -> str:
    """The result record ``name`` of a run: what the job returned, read back by its operator.

    ``name`` is unique per Airflow task instance (see :func:`embedfresh.core.results.result_name`),
    the job's own name when a person runs it at a shell.
    """
    return f"{results(model, run_id)}/{safe_id(name, 'result name')}.json"


def model_version(model: str, version: str) -> str:
    return f"models/{safe_id(model, 'model')}/versions/{safe_id(version, 'model version')}"


def model_versions(model: str) -> str:
    return f"models/{safe_id(model, 'model')}/versions"


def registry(model: str) -> str:
    return f"models/{safe_id(model, 'model')}/registry.json"


def releases(model: str) -> str:
    return f"models/{safe_id(model, 'model')}/releases"


def release(model: str, release_id: str) -> str:
    """A release: the model version, its corpora's embedding sets and index tables."""
    return f"{releases(model)}/{safe_id(release_id, 'release')}.json"


def sync_record(model: str, release_id: str, corpus_name: str) -> str:
    """Which change sets a release's table of ``corpus_name`` holds (the corpus sync's
    record; the release document itself never changes)."""
    return (
        f"models/{safe_id(model, 'model')}/sync/{safe_id(release_id, 'release')}/"
        f"{safe_id(corpus_name, 'corpus')}.json"
    )


def index_location(model: str, release_id: str) -> str:
    """Where a release's tables live since ``index_attach`` re-attached or copied them
    (the release document, immutable, keeps where they were loaded)."""
    return f"models/{safe_id(model, 'model')}/sync/{safe_id(release_id, 'release')}/_INDEX.json"


def embeddings_root(model: str) -> str:
    """Every embedding set of ``model``: ``{version}/{corpus}/`` under it."""
    return f"embeddings/{safe_id(model, 'model')}"


def embeddings(model: str, version: str, corpus_name: str) -> str:
    return (
        f"embeddings/{safe_id(model, 'model')}/{safe_id(version, 'model version')}/"
        f"{safe_id(corpus_name, 'corpus')}"
    )


def compile_cache(backend: str, key: str) -> str:
    """One compile-cache entry; it counts only once its COMMIT marker is written."""
    return f"{compile_cache_backend(backend)}/{safe_id(key, 'cache key')}"


def compile_cache_backend(backend: str) -> str:
    """A backend's compile cache; for ``neuron`` also ``NEURON_COMPILE_CACHE_URL``, where
    the Neuron runtime keeps its own NEFF entries beside ours."""
    return f"compile-cache/{safe_id(backend, 'backend')}"


def train_partitions(dataset: str) -> str:
    """The folder holding a dataset's ``dt=YYYY-MM-DD`` training partitions."""
    return f"datasets/{safe_id(dataset, 'dataset')}/train"
