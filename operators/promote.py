"""Moves of the production pointer, each announcing the model Asset: a promotion after a
PASS, and a person's two overrides, promote anyway and roll back."""

from __future__ import annotations

from typing import Any

from embedfresh.operators.assets import (
    MODEL_ASSET_URI,
    MODEL_PROMOTIONS_ALIAS,
    AssetAnnouncingOperator,
    model_asset,
)

__all__ = [
    "MODEL_PROMOTIONS_ALIAS",
    "PromoteAnywayOperator",
    "PromoteModelOperator",
    "RollbackOperator",
    "model_asset",
]


class PromoteModelOperator(AssetAnnouncingOperator):
    """Moves the registry's production pointer to the run's candidate (``python -m embedfresh.jobs.promote``).

    Only after the run's gate said PASS, by compare-and-swap on the production version the
    gate decided against; otherwise exit 3 (no retry) and production stays. On success the
    task updates the model's Asset ``embedfresh://models/<model>``: as a static outlet when
    ``model`` is a plain string, else through the Asset alias ``embedfresh-model-promotions``.
    The event's extra holds the new production ``version`` and the ``registry`` URL.
    """

    job_name = "promote"
    asset_alias = MODEL_PROMOTIONS_ALIAS
    asset_uri = MODEL_ASSET_URI
    asset_defaults = {"model": "tiny"}
    asset_extra_keys = {"version": "production", "registry": "registry"}


#: Who a person's override is recorded as: the Airflow user who triggered the run (the
#: scheduler's runs have none, which the jobs refuse: an override is a person's act).
TRIGGERING_USER = "{{ dag_run.triggering_user_name or '' }}"


class _PersonsMoveOperator(AssetAnnouncingOperator):
    """A production move a person asks for, with a reason; recorded with who asked.

    :param version: the version to make production (templated).
    :param reason: why; required, recorded in the registry's history (templated).
    :param who: who asks, recorded in the registry's history (templated); default: the
        user who triggered the DAG run.
    """

    asset_alias = MODEL_PROMOTIONS_ALIAS
    asset_uri = MODEL_ASSET_URI
    asset_defaults = {"model": "tiny"}
    asset_extra_keys = {"version": "production", "registry": "registry", "who": "who"}
    template_fields = (*AssetAnnouncingOperator.template_fields, "version", "reason", "who")
    version_setting: str

    def __init__(
        self, *, version: str, reason: str, who: str = TRIGGERING_USER, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.reason = reason
        self.who = who

    def job_specific_settings(self) -> dict[str, Any]:
        return {self.version_setting: self.version, "reason": self.reason, "who": self.who}


class PromoteAnywayOperator(_PersonsMoveOperator):
    """Makes ``version`` production although no gate passed it (``python -m embedfresh.jobs.promote_anyway``).

    The one exception to "only PASS promotes": a person's override with a required
    reason, recorded in the registry's history with who triggered it. The version must
    still be committed and intact (exit 2, no retry, production stays). Updates the
    model's Asset like a promotion.
    """

    job_name = "promote_anyway"
    version_setting = "version"


class RollbackOperator(_PersonsMoveOperator):
    """Moves production back to ``version``, an earlier production version (``python -m embedfresh.jobs.rollback``).

    Recorded in the registry's history with who triggered it and why. A version that was
    never production, or a damaged one, is refused (exit 2, no retry). Updates the
    model's Asset like a promotion.
    """

    job_name = "rollback"
    version_setting = "to_version"
