"""Which report of its run a task writes: keyed by the task, so any number of
evaluations, gates and embeds of one run coexist (``runs/<model>/<run_id>/reports/``)."""

from __future__ import annotations


def report_name(kind: str, task_id: str, usual_task_id: str, map_index: int | None = None) -> str:
    """The report (``reports/{name}.json``) a task of a job kind writes in its run.

    ``kind`` itself for the task id a DAG usually gives that job (``eval`` for the task
    ``evaluate``, ``gate`` for ``gate``): what the web UI and the tools read; else
    ``{kind}-{task_id}``; a mapped task adds ``-{map_index}``. Two tasks of one DAG
    never share a name.
    """
    name = kind if task_id == usual_task_id else f"{kind}-{task_id}"
    if map_index is not None and map_index >= 0:
        name = f"{name}-{map_index}"
    return name


def eval_report_name(task_id: str, map_index: int | None = None) -> str:
    """The report of the evaluation task ``task_id``."""
    return report_name("eval", task_id, "evaluate", map_index)


def gate_report_name(task_id: str, map_index: int | None = None) -> str:
    """The report of the gate task ``task_id``."""
    return report_name("gate", task_id, "gate", map_index)
