"""Promotion: moves the production pointer after a PASS and announces the model Asset."""

from __future__ import annotations

from embedfresh.operators.assets import (
    MODEL_ASSET_URI,
    MODEL_PROMOTIONS_ALIAS,
    AssetAnnouncingOperator,
    model_asset,
)

__all__ = ["MODEL_PROMOTIONS_ALIAS", "PromoteModelOperator", "model_asset"]


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
