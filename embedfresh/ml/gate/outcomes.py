"""The per-example outcomes of an eval report, as the gate and the parity job pair them."""

from __future__ import annotations

from typing import Any

import numpy as np

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.reader import read_parquet
from embedfresh.ml.gate.stats import RANKING_METRICS


def load_outcomes(store: ArtifactStore, report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-example arrays of an eval report, grouped as the gate expects."""
    try:
        examples_url, queries_url = report["outcomes"]["examples"], report["outcomes"]["queries"]
    except (KeyError, TypeError) as e:
        raise BadInputError(f"eval report lacks its outcomes: {e}") from e
    tables = {}
    for key, url in (("examples", examples_url), ("queries", queries_url)):
        rel = url.removeprefix(store.url("")).lstrip("/")
        try:
            tables[key] = read_parquet(store, rel)
        except (FileNotFoundError, BadInputError) as e:
            raise BadInputError(
                f"eval outcomes {url} are missing or unreadable ({e}): run the evaluate job again"
            ) from e
    ex, qs = tables["examples"], tables["queries"]
    return {
        "relevance": {
            "example_id": _pair_id(
                ex.column("query_id").to_numpy(), ex.column("product_id").to_numpy()
            ),
            "label": ex.column("label").to_numpy(),
            "prob": ex.column("prob").to_numpy(),
        },
        "retrieval": {
            name: qs.column(name).to_numpy()
            for name in ("query_id", *RANKING_METRICS)
            if name in qs.column_names
        },
    }


def _pair_id(query_ids: np.ndarray, product_ids: np.ndarray) -> np.ndarray:
    """One 64-bit id per (query, product) pair, to check both sides hold the same rows."""
    with np.errstate(over="ignore"):
        return (query_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ product_ids.astype(
            np.uint64
        )
