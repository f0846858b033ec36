"""The extra links of a job task: its AWS Batch job, and the model's "Model quality" page.

Airflow 3 computes a task's links in the worker when the task ends and keeps each one
as an XCom; the UI shows those. The AWS Batch ones are the Amazon provider's own
(job, definition, queue, CloudWatch log), filled by the AWS Batch runner the way the
provider's ``BatchOperator`` fills them (:meth:`AwsBatchRunner.link_to`); on another
runner they stay empty and the UI leaves them out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from embedfresh.core.settings import ExecutionMode

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: The execution mode whose tasks link to their AWS Batch job.
AWS_BATCH = str(ExecutionMode.AWS_BATCH)

#: Where the plugin's "Model quality" page is mounted on the API server (the plugin's
#: ``URL_PREFIX``; the operators do not import the plugin, a test keeps the two equal).
MODEL_QUALITY_PATH = "/model-quality"


def model_quality_url(model: str, base_url: str | None = None) -> str:
    """The "Model quality" page of ``model``: ``{base}/model-quality/?model=<model>``.

    :param base_url: the API server's address; ``None``: Airflow's ``[api] base_url``,
        and a link relative to the UI's own host when that is not set.
    """
    if base_url is None:
        from airflow.sdk.configuration import conf

        base_url = conf.get("api", "base_url", fallback="") or ""
    return f"{base_url.rstrip('/')}{MODEL_QUALITY_PATH}/?model={quote(str(model), safe='')}"


class ModelQualityLink(BaseOperatorLink):
    """The task's model on the "Model quality" page (gate decisions, curves, releases)."""

    name = "Model quality"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        model = getattr(operator, "model", None)
        if not model or "{{" in str(model):  # no model, or one never rendered
            return ""
        return model_quality_url(str(model))


class JobExtraLinks:
    """``operator_extra_links`` of :class:`~embedfresh.operators.EmbedfreshJobOperator`,
    built when first read: the provider's link classes import botocore, which a DAG file
    importing the operators should not pay for (Airflow reads the links when it
    serialises the DAG and when a task ends).

    A task that does not run on AWS Batch has only the "Model quality" link: Airflow
    computes every link when a task ends, and each AWS link it cannot find logs an error
    in the task's log. (A mapped task's links are its class's, all of them, until it is
    unmapped.)
    """

    _links: tuple[BaseOperatorLink, ...] | None = None

    def __get__(self, instance: Any, owner: type | None = None) -> tuple[BaseOperatorLink, ...]:
        links = self.all_links()
        mode = getattr(instance, "execution_mode", AWS_BATCH) if instance is not None else AWS_BATCH
        return links if mode == AWS_BATCH else links[:1]

    @staticmethod
    def all_links() -> tuple[BaseOperatorLink, ...]:
        """Every link a job task can have, the provider's imported on first use."""
        if JobExtraLinks._links is None:
            from airflow.providers.amazon.aws.links.batch import (
                BatchJobDefinitionLink,
                BatchJobDetailsLink,
                BatchJobQueueLink,
            )
            from airflow.providers.amazon.aws.links.logs import CloudWatchEventsLink

            JobExtraLinks._links = (
                ModelQualityLink(),
                BatchJobDetailsLink(),
                BatchJobDefinitionLink(),
                BatchJobQueueLink(),
                CloudWatchEventsLink(),
            )
        return JobExtraLinks._links
