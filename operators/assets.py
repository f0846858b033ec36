"""Assets the operators announce, and the one mechanism that announces them.

An operator whose Asset depends on templated arguments (``"{{ params.model }}"``) cannot
name it when the DAG is parsed: it then emits through an :class:`~airflow.sdk.AssetAlias`
and adds the concrete Asset at run time. With plain strings the Asset is a static outlet.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import Asset, AssetAlias

from embedfresh.operators.base import EmbedfreshJobOperator

#: Alias the promote task emits model Assets through when the model is only known at
#: run time (templated), e.g. ``"{{ params.model }}"``.
MODEL_PROMOTIONS_ALIAS = "embedfresh-model-promotions"

#: Alias the embedding verify task emits embedding Assets through when the model or
#: corpus is only known at run time.
EMBEDDING_PUBLICATIONS_ALIAS = "embedfresh-embedding-publications"


MODEL_ASSET_URI = "embedfresh://models/{model}"
EMBEDDINGS_ASSET_URI = "embedfresh://embeddings/{model}/{corpus}"


def model_asset(model: str) -> Asset:
    """The Asset a promotion of ``model`` updates; consumers schedule on it."""
    return Asset(MODEL_ASSET_URI.format(model=model))


def embeddings_asset(model: str, corpus: str) -> Asset:
    """The Asset a verified embedding of ``corpus`` with ``model`` updates."""
    return Asset(EMBEDDINGS_ASSET_URI.format(model=model, corpus=corpus))


def is_templated(*values: Any) -> bool:
    return any(isinstance(v, str) and ("{{" in v or "{%" in v) for v in values)


class AssetAnnouncingOperator(EmbedfreshJobOperator):
    """A job operator that, on success, updates one Asset with extra from the job's summary.

    Subclasses declare the Asset: :attr:`asset_uri`, a format string over the operator
    arguments named in :attr:`asset_defaults` (read from the keyword arguments at
    construction, from the rendered attributes at run time), the :attr:`asset_alias` used
    when any of them is templated, and :attr:`asset_extra_keys` (extra key -> summary key).
    """

    asset_alias: ClassVar[str]
    asset_uri: ClassVar[str]
    asset_defaults: ClassVar[dict[str, str]]
    asset_extra_keys: ClassVar[dict[str, str]] = {}

    def __init__(self, **kwargs: Any) -> None:
        if "outlets" not in kwargs:
            args = self.asset_arguments(kwargs)
            kwargs["outlets"] = [
                AssetAlias(self.asset_alias)
                if is_templated(*args.values())
                else self.asset_for(**args)
            ]
        super().__init__(**kwargs)

    @classmethod
    def asset_arguments(cls, source: dict[str, Any]) -> dict[str, Any]:
        """The arguments :meth:`asset_for` takes, read from ``source`` (kwargs or attributes)."""
        return {name: source.get(name, default) for name, default in cls.asset_defaults.items()}

    @classmethod
    def asset_for(cls, **args: Any) -> Asset:
        return Asset(cls.asset_uri.format(**args))

    def asset_extra(self, summary: dict[str, Any]) -> dict[str, Any]:
        return {key: summary.get(source) for key, source in self.asset_extra_keys.items()}

    def execute(self, context: Any) -> dict[str, Any]:
        return self.announce(context, super().execute(context))

    def execute_complete(
        self,
        context: Any,
        event: dict[str, Any] | None = None,
        result: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        return self.announce(context, super().execute_complete(context, event, result))

    def announce(self, context: Any, summary: dict[str, Any]) -> dict[str, Any]:
        """Attach the extra to the static Asset outlet, or add the Asset through the alias."""
        asset = self.asset_for(**self.asset_arguments(vars(self)))
        extra = self.asset_extra(summary)
        for outlet in self.outlets:
            if isinstance(outlet, AssetAlias) and outlet.name == self.asset_alias:
                context["outlet_events"][outlet].add(asset, extra=extra)
            elif isinstance(outlet, Asset) and outlet == asset:
                context["outlet_events"][outlet].extra = extra
        return summary
