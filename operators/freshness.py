"""Production's age, measured at the end of every refresh (:mod:`embedfresh.core.freshness`).

:class:`FreshnessOperator` runs last in ``embedding_model_refresh`` whatever happened
before it (trigger rule ``all_done``): it returns the facts (production, the newest data
it trained on, its age in days of data, and the runs that held it) as its XCom, logs
them, and, given ``on_success_callback=notifiers("stale")``, tells people when the age
reaches ``EMBEDFRESH_STALE_AFTER_DAYS`` (default 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


class FreshnessOperator(BaseOperator):
    """Measures how many days of data production lacks, and what held it.

    :param artifact_root: the artifact store (templated).
    :param model: the model (templated).
    :param dataset: the data set whose partitions date the newest data (templated).
    """

    template_fields: Sequence[str] = ("artifact_root", "model", "dataset")

    def __init__(
        self, *, artifact_root: str, model: str, dataset: str = "products", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.artifact_root, self.model, self.dataset = artifact_root, model, dataset

    def execute(self, context: Any) -> dict[str, Any]:
        from embedfresh.core.freshness import freshness, stale_after_days
        from embedfresh.core.storage import ArtifactStore

        facts = freshness(
            ArtifactStore(self.artifact_root),
            self.model,
            context["run_id"],
            self.dataset,
            stale_after_days(),
        )
        level = self.log.warning if facts["stale"] else self.log.info
        level(
            "production %s trained on data through %s: %s days behind the newest data (%s)"
            "%s", facts["production"], facts["trained_through"], facts["age_days"],
            facts["newest_data"], f"; STALE (limit {facts['stale_after_days']} days), held by "
            f"{[r['run_id'] for r in facts['held_by']]}" if facts["stale"] else "",
        )  # fmt: skip
        return facts
