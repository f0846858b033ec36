"""Metrics on held-out outcomes and the paired bootstrap of their relative difference.

Outcomes are dicts of 1-D arrays aligned by example (by query for retrieval):

- ``label`` (0/1) and ``prob`` (in [0, 1]) for the relevance head: ``accuracy``
  (threshold 0.5), ``log_loss`` (probabilities clipped to [1e-7, 1 - 1e-7], lower is better)
  and ``auc`` (ROC AUC, ties counted half);
- ``ndcg_at_10``, ``recall_at_10``, ``recall_at_100``, ``mrr_at_10`` (in [0, 1], one
  value per judged query) for search (:mod:`embedfresh.ml.ranking`).

Optional ``example_id`` (relevance) and ``query_id`` (retrieval) arrays, when both sides carry
them, must match exactly: the cheapest proof that both models were scored on the same rows.

The paired bootstrap draws n example indices with replacement, B times, and applies each
draw to candidate and reference alike, so the interval of d = (m_cand - m_ref) / m_ref
reflects only how the two models differ on the same examples, not how hard the examples are.
Resamples are processed in chunks of bounded memory, each chunk with its own generator
spawned from ``seed`` (results depend on seed, n and B, never on thread scheduling). Chunks
run on up to four threads, since numpy's generators, ``take`` and reductions release the GIL;
how much that buys depends on how busy the machine is.

Measured with ``python -m embedfresh.ml.gate.stats`` (n = 1,000,000 synthetic examples) on the 2-core
development VM (AMD EPYC, numpy 2.4), wall time; the first figure with the VM otherwise idle
(load ~0.9), the second while other jobs kept it at load 4-5:

- accuracy, 1000 resamples: 0.1 s / 0.1-0.2 s (exact multinomial over the 4 joint outcomes,
  see :func:`_grouped`); forced through the index path: 8.8-9.5 s in every run;
- log_loss, 1000 resamples (index path): 5.6 s / 8.5-9.8 s;
- recall_at_10 with 11 distinct values, 1000 resamples: 0.04 s / 0.04-0.07 s;
- auc, 300 resamples: 17 s / 14-16 s.

The index path costs about 2 ms per million draws for the indices and 4-8 ms for the two
gathers, which miss the cache at this size: that, not arithmetic, is the floor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from embedfresh.core.exit_codes import BadInputError

Outcomes = Mapping[str, Any]

PROB_EPS = 1e-7
# Bytes of working memory per chunk of resamples; a few chunks run at once (one per worker).
_CHUNK_BYTES = 128 * 2**20
_WORKERS = max(1, min(4, os.cpu_count() or 1))
# The grouped (multinomial) path pays one binomial draw per distinct value pair per resample
# (measured ~60-120 ns, against ~5-10 ns for an index draw plus its gather), so it wins while
# there are fewer than about n/16 pairs.
_GROUPED_MAX_FRACTION = 1 / 16
# Resamples where the metric is undefined (AUC with a class missing, reference value 0) are
# dropped; more than this share of them means the eval set is too small to bootstrap.
_MAX_DROPPED_FRACTION = 0.01


@dataclass(frozen=True)
class _MetricSpec:
    keys: tuple[str, ...]
    id_key: str
    kind: str  # "mean" (of a per-example value) or "auc"


METRICS: dict[str, _MetricSpec] = {
    "accuracy": _MetricSpec(("label", "prob"), "example_id", "mean"),
    "log_loss": _MetricSpec(("label", "prob"), "example_id", "mean"),
    "auc": _MetricSpec(("label", "prob"), "example_id", "auc"),
    **{
        name: _MetricSpec((name,), "query_id", "mean")
        for name in ("ndcg_at_10", "recall_at_10", "recall_at_100", "mrr_at_10")
    },
}
#: The search metrics: one value per judged query (:mod:`embedfresh.ml.ranking`).
RANKING_METRICS = tuple(name for name, spec in METRICS.items() if spec.id_key == "query_id")


@dataclass(frozen=True)
class BootstrapResult:
    """A paired bootstrap of d = (m_cand - m_ref) / m_ref.

    ``ci_low``/``ci_high`` are the percentile interval of d over the resamples at
    ``confidence``; ``se`` is the standard deviation of d over them; ``resamples`` counts the
    resamples actually used (those where the metric was defined on both sides).
    """

    metric: str
    m_cand: float
    m_ref: float
    d: float
    ci_low: float
    ci_high: float
    n: int
    resamples: int
    confidence: float
    se: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def required_keys(name: str) -> tuple[str, ...]:
    """The outcome arrays metric ``name`` reads."""
    return _spec(name).keys


def check_side(name: str, outcomes: Outcomes, side: str) -> None:
    """Check one side's arrays for metric ``name`` as :func:`paired_bootstrap` will.

    :raises BadInputError: unknown metric, missing or malformed arrays, or no rows.
    """
    _validate_side(name, _spec(name), outcomes, side)


def metric_value(name: str, outcomes: Outcomes) -> float:
    """Metric ``name`` on all rows of ``outcomes``."""
    spec = _spec(name)
    arrays = _validate_side(name, spec, outcomes, "outcomes")
    return _value(name, spec, arrays)


def metric_on_resamples(name: str, outcomes: Outcomes, idx: np.ndarray) -> np.ndarray:
    """Metric ``name`` on each row of ``idx`` (B x m example indices): one value per resample.

    AUC is NaN on a resample that holds a single class.
    """
    spec = _spec(name)
    arrays = _validate_side(name, spec, outcomes, "outcomes")
    n = _rows(arrays)
    idx = np.asarray(idx)
    if idx.ndim != 2 or idx.shape[1] == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise BadInputError(f"{name}: resample indices must be a non-empty 2-D integer array")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise BadInputError(f"{name}: resample indices out of range for {n} rows")
    rows = _chunk_rows(max(n, idx.shape[1]), 72 if spec.kind == "auc" else 24, idx.shape[0])
    out = []
    if spec.kind == "mean":
        values = _per_example(name, arrays)
        for s in range(0, idx.shape[0], rows):
            out.append(np.take(values, idx[s : s + rows]).sum(axis=1) / idx.shape[1])
    else:
        sorted_side = _AucSorted(arrays["label"], arrays["prob"])
        for s in range(0, idx.shape[0], rows):
            out.append(sorted_side.auc(_counts(idx[s : s + rows], n)))
    return np.concatenate(out) if out else np.empty(0)


def paired_bootstrap(
    name: str,
    cand: Outcomes,
    ref: Outcomes,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> BootstrapResult:
    """Paired bootstrap interval of d = (m_cand - m_ref) / m_ref for metric ``name``.

    :raises BadInputError: unknown metric, missing or malformed arrays, no rows, candidate
        and reference not on the same examples, non-finite values, m_ref == 0, or too many
        resamples where the metric is undefined.
    """
    spec = _spec(name)
    if not isinstance(resamples, (int, np.integer)) or resamples < 2:
        raise BadInputError(f"resamples must be an integer >= 2, got {resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise BadInputError(f"confidence must lie in (0, 1), got {confidence!r}")
    c, r = _validate_pair(name, spec, cand, ref)
    n = _rows(c)
    m_cand, m_ref = _value(name, spec, c), _value(name, spec, r)
    if m_ref == 0.0:
        raise BadInputError(f"{name}: reference value is 0, the relative difference is undefined")

    if spec.kind == "mean":
        mc, mr = _mean_resamples(_per_example(name, c), _per_example(name, r), resamples, seed)
    else:
        mc, mr = _auc_resamples(c, r, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        d_res = (mc - mr) / mr
    finite = np.isfinite(d_res)
    dropped = int(resamples - finite.sum())
    if dropped > _MAX_DROPPED_FRACTION * resamples:
        raise BadInputError(
            f"{name}: undefined on {dropped} of {resamples} resamples (a class or every hit "
            f"missing); {n} rows are too few to bootstrap this metric"
        )
    d_res = d_res[finite]
    alpha = 1.0 - confidence
    lo, hi = np.quantile(d_res, [alpha / 2, 1 - alpha / 2])
    return BootstrapResult(
        metric=name,
        m_cand=float(m_cand),
        m_ref=float(m_ref),
        d=float((m_cand - m_ref) / m_ref),
        ci_low=float(lo),
        ci_high=float(hi),
        n=n,
        resamples=int(d_res.size),
        confidence=float(confidence),
        se=float(d_res.std(ddof=1)),
    )


# --- metrics ----------------------------------------------------------------------------------


def _spec(name: str) -> _MetricSpec:
    try:
        return METRICS[name]
    except KeyError:
        raise BadInputError(f"unknown metric {name!r}; known: {sorted(METRICS)}") from None


def _value(name: str, spec: _MetricSpec, arrays: dict[str, np.ndarray]) -> float:
    if spec.kind == "mean":
        return float(_per_example(name, arrays).mean())
    n = _rows(arrays)
    value = _AucSorted(arrays["label"], arrays["prob"]).auc(np.ones((1, n), np.int64))[0]
    if not np.isfinite(value):
        raise BadInputError(f"{name}: needs both positive and negative labels")
    return float(value)


def _per_example(name: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    if name == "accuracy":
        return ((arrays["prob"] >= 0.5) == (arrays["label"] == 1)).astype(np.float64)
    if name == "log_loss":
        p = np.clip(arrays["prob"].astype(np.float64), PROB_EPS, 1.0 - PROB_EPS)
        return np.where(arrays["label"] == 1, -np.log(p), -np.log1p(-p))
    if name in RANKING_METRICS:
        return arrays[name].astype(np.float64)
    raise AssertionError(f"no per-example value for {name}")


class _AucSorted:
    """One side's scores, sorted once so that each resample costs a gather and a few scans.

    A resample is a multiplicity vector over examples. With equal scores grouped, a positive
    beats every negative of a lower group and half of those in its own group, so
    2 * AUC * P * N = sum over groups of pos_g * (2 * neg_below_g + neg_g): the Mann-Whitney
    count with ties counted half. It stays in int64, exact, up to the final division.
    """

    def __init__(self, label: np.ndarray, prob: np.ndarray) -> None:
        self.order = np.argsort(prob, kind="stable")
        p = prob[self.order]
        self.pos = label[self.order] == 1
        starts = np.flatnonzero(np.concatenate(([True], p[1:] != p[:-1])))
        self.starts = None if starts.size == p.size else starts

    def auc(self, counts: np.ndarray) -> np.ndarray:
        w = counts[:, self.order]
        pos = np.where(self.pos, w, 0)
        neg = np.subtract(w, pos, out=w)
        if self.starts is not None:
            pos = np.add.reduceat(pos, self.starts, axis=1)
            neg = np.add.reduceat(neg, self.starts, axis=1)
        n_pos, n_neg = pos.sum(axis=1), neg.sum(axis=1)
        # 2 * neg_below + neg_g == cumsum + (cumsum - neg_g), computed in place.
        below2 = np.cumsum(neg, axis=1)
        below2 *= 2
        below2 -= neg
        twice = np.einsum("ij,ij->i", pos, below2)
        with np.errstate(divide="ignore", invalid="ignore"):
            return twice / (2.0 * n_pos * n_neg)


# --- resampling -------------------------------------------------------------------------------
#
# Classic resampling (n indices drawn with replacement) rather than Poisson(1) weights: it is
# the textbook paired bootstrap, and numpy draws bounded integers far faster than Poisson
# variates (measured: ~2 s against ~24 s for 10^9 draws on the development VM).
# Generator.multinomial over n equal cells would give the same counts but draws n binomials
# per resample, slower still; it pays only over a few distinct values: the grouped path.
# At a million rows the cost is the gather more than the draw (random reads into 8 MB
# arrays miss the cache); drawing block-local indices to keep the reads in cache was tried
# and gained nothing measurable here, so the simple draw stays.


def _draw(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    """``rows`` resamples of n indices drawn uniformly with replacement, as a (rows, n) array."""
    return rng.integers(0, n, size=(rows, n), dtype=np.int64)


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    """Multiplicity of each example in each row of ``idx``: one bincount over offset rows."""
    offsets = np.arange(idx.shape[0], dtype=np.int64)[:, None] * n
    flat = (idx + offsets).ravel()
    return np.bincount(flat, minlength=idx.shape[0] * n).reshape(idx.shape[0], n)


def _chunk_rows(cells_per_row: int, bytes_per_cell: int, total: int) -> int:
    return int(max(1, min(total, _CHUNK_BYTES // max(1, cells_per_row * bytes_per_cell))))


def _run_chunks(
    total: int,
    rows: int,
    seed: int,
    job: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    n_chunks = -(-total // rows)
    seeds = np.random.SeedSequence(seed).spawn(n_chunks)

    def run(k: int) -> tuple[np.ndarray, np.ndarray]:
        return job(np.random.default_rng(seeds[k]), min(rows, total - k * rows))

    if n_chunks == 1 or _WORKERS == 1:
        parts = [run(k) for k in range(n_chunks)]
    else:
        with ThreadPoolExecutor(max_workers=min(_WORKERS, n_chunks)) as pool:
            parts = list(pool.map(run, range(n_chunks)))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _grouped(vc: np.ndarray, vr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Distinct (candidate, reference) value pairs and their frequencies, if there are few.

    A mean over a resample depends only on how many times each distinct pair was drawn, and
    those counts are exactly Multinomial(n, freq / n): the classic bootstrap, at a cost in
    the number of pairs rather than n (4 pairs for accuracy).
    """
    limit = int(vc.size * _GROUPED_MAX_FRACTION)
    uc, ic = np.unique(vc, return_inverse=True)
    if uc.size > limit:
        return None
    ur, ir = np.unique(vr, return_inverse=True)
    if ur.size > limit:
        return None
    codes, freq = np.unique(ic.astype(np.int64) * ur.size + ir, return_counts=True)
    if codes.size > limit:
        return None
    return uc[codes // ur.size], ur[codes % ur.size], freq


def _mean_resamples(
    vc: np.ndarray, vr: np.ndarray, total: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    n = vc.size
    groups = _grouped(vc, vr)
    if groups is not None:
        gc, gr, freq = groups
        pvals = freq / n

        def grouped_job(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
            counts = rng.multinomial(n, pvals, size=rows)
            # Two products with the same kernel: identical sides give bit-identical sums.
            # einsum, not BLAS: OpenBLAS threads spin against the workers on a small VM.
            return np.einsum("ij,j->i", counts, gc) / n, np.einsum("ij,j->i", counts, gr) / n

        return _run_chunks(total, _chunk_rows(gc.size, 16, total), seed, grouped_job)

    def index_job(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
        idx = _draw(rng, rows, n)
        return np.take(vc, idx).sum(axis=1) / n, np.take(vr, idx).sum(axis=1) / n

    return _run_chunks(total, _chunk_rows(n, 24, total), seed, index_job)


def _auc_resamples(
    c: dict[str, np.ndarray], r: dict[str, np.ndarray], total: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    n = _rows(c)
    sides = _AucSorted(c["label"], c["prob"]), _AucSorted(r["label"], r["prob"])

    def job(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
        counts = _counts(_draw(rng, rows, n), n)
        return sides[0].auc(counts), sides[1].auc(counts)

    return _run_chunks(total, _chunk_rows(n, 72, total), seed, job)


# --- validation -------------------------------------------------------------------------------


def _rows(arrays: dict[str, np.ndarray]) -> int:
    return int(next(iter(arrays.values())).shape[0])


def _validate_side(
    name: str, spec: _MetricSpec, outcomes: Outcomes, side: str
) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for key in (*spec.keys, spec.id_key):
        value = outcomes.get(key)
        if value is None:
            if key == spec.id_key:
                continue
            raise BadInputError(f"{name}: {side} outcomes lack {key!r}")
        arr = np.asarray(value)
        if arr.ndim != 1:
            raise BadInputError(f"{name}: {side} {key!r} must be 1-D, got shape {arr.shape}")
        if key != spec.id_key:
            if arr.dtype.kind not in "biuf":
                raise BadInputError(f"{name}: {side} {key!r} must be numeric, got {arr.dtype}")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise BadInputError(f"{name}: {side} {key!r} holds non-finite values")
        arrays[key] = arr
    lengths = {k: a.shape[0] for k, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise BadInputError(f"{name}: {side} arrays are misaligned, lengths {lengths}")
    if next(iter(lengths.values())) == 0:
        raise BadInputError(f"{name}: {side} outcomes have no rows")
    if "label" in arrays and not np.isin(arrays["label"], (0, 1)).all():
        raise BadInputError(f"{name}: {side} 'label' must be 0 or 1")
    for key in ("prob", "recall_at_10"):
        if key in arrays and ((arrays[key] < 0).any() or (arrays[key] > 1).any()):
            raise BadInputError(f"{name}: {side} {key!r} must lie in [0, 1]")
    return arrays


def _validate_pair(
    name: str, spec: _MetricSpec, cand: Outcomes, ref: Outcomes
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    c = _validate_side(name, spec, cand, "candidate")
    r = _validate_side(name, spec, ref, "reference")
    n_c, n_r = _rows(c), _rows(r)
    if n_c != n_r:
        raise BadInputError(
            f"{name}: candidate has {n_c} rows and reference {n_r}: not the same examples"
        )
    for key in ("label", spec.id_key):
        if key in c and key in r:
            try:
                differ = np.flatnonzero(c[key] != r[key])
            except TypeError:  # incomparable id types (numbers against strings) differ everywhere
                differ = np.arange(n_c)
            if differ.size:
                raise BadInputError(
                    f"{name}: {key!r} differs between candidate and reference at {differ.size} "
                    f"rows (first at row {differ[0]}): not the same examples"
                )
    return c, r


def _timings() -> None:
    """Print the timings quoted in the module docstring (n = 1,000,000)."""
    import time

    global _GROUPED_MAX_FRACTION
    rng = np.random.default_rng(0)
    n = 1_000_000
    label = rng.integers(0, 2, n)
    prob_r = np.clip(0.5 + (label - 0.5) * 0.4 + rng.normal(0, 0.2, n), 0.001, 0.999)
    prob_c = np.clip(prob_r + rng.normal(0, 0.01, n), 0.001, 0.999)
    recall = rng.integers(0, 11, n) / 10
    cand = {"label": label, "prob": prob_c, "recall_at_10": recall}
    ref = {"label": label, "prob": prob_r, "recall_at_10": np.roll(recall, 1)}
    cases = [("accuracy", 1000), ("log_loss", 1000), ("recall_at_10", 1000), ("auc", 300)]
    for name, resamples in cases:
        t0 = time.perf_counter()
        res = paired_bootstrap(name, cand, ref, resamples=resamples)
        print(
            f"{name:13s} B={resamples:5d} {time.perf_counter() - t0:6.2f} s  "
            f"d={res.d:+.5f} [{res.ci_low:+.5f}, {res.ci_high:+.5f}]"
        )
    _GROUPED_MAX_FRACTION = 0.0
    t0 = time.perf_counter()
    paired_bootstrap("accuracy", cand, ref, resamples=1000)
    print(f"accuracy (index path) B= 1000 {time.perf_counter() - t0:6.2f} s")


if __name__ == "__main__":
    _timings()
