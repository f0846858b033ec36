"""Promotion: moves the production pointer after a PASS and announces the model Asset."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias

from operators.base import EmbedfreshJobOperator

#: Alias the promote task emits model Assets through when the model is only known at
#: run time (templated), e.g. ``"{{ params.model }}"``.
MODEL_PROMOTIONS_ALIAS = "embedfresh-model-promotions"


def model_asset(model: str) -> Asset:
    """The Asset a promotion of ``model`` updates; consumers schedule on it."""
    return Asset(f"embedfresh://models/{model}")


class PromoteModelOperator(EmbedfreshJobOperator):
    """Moves the registry's production pointer to the run's candidate (``python -m jobs.promote``).

    Only after the run's gate said PASS, by compare-and-swap on the production version the
    gate decided against; otherwise exit 3 (no retry) and production stays. On success the
    task updates the model's Asset ``embedfresh://models/<model>``: as a static outlet when
    ``model`` is a plain string, else through the Asset alias ``embedfresh-model-promotions``.
    """

    job_name = "promote"

    def __init__(self, *, model: str = "tiny", **kwargs: Any) -> None:
        if "outlets" not in kwargs:
            templated = "{{" in model or "{%" in model
            kwargs["outlets"] = [
                AssetAlias(MODEL_PROMOTIONS_ALIAS) if templated else model_asset(model)
            ]
        super().__init__(model=model, **kwargs)

    def execute(self, context: Any) -> dict[str, Any]:
        return self._announce(context, super().execute(context))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._announce(context, super().execute_complete(context, event))

    def _announce(self, context: Any, summary: dict[str, Any]) -> dict[str, Any]:
        extra = {"version": summary.get("production"), "registry": summary.get("registry")}
        for outlet in self.outlets:
            if isinstance(outlet, AssetAlias) and outlet.name == MODEL_PROMOTIONS_ALIAS:
                context["outlet_events"][outlet].add(model_asset(self.model), extra=extra)
            elif isinstance(outlet, Asset) and outlet == model_asset(self.model):
                context["outlet_events"][outlet].extra = extra
        return summary
