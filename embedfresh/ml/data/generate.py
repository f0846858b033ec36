"""A deterministic generator of a realistic product-search relevance data set.

A seed fixes a catalogue of products (categories, synonyms, brands, attributes, titles,
descriptions and dense features). Each day's training partition samples shopper queries
and, per query, a handful of candidate products: same-category products with and without
the asked-for attribute, products of a related category (hard negatives) and of any other
category (easy negatives). A pair is relevant with probability ``sigmoid(logit)`` where
the logit is driven by text semantics (query category vs the product's category, worded
with different synonyms; the query attribute vs the product's attributes) and by feature
interactions (budget intent x price, premium intent x rating, rating x log(review count),
out of stock), so a model has to read the text and combine it with the features.

Everything is drawn from ``numpy.random.Generator(PCG64)`` seeded through
``SeedSequence((seed, stream tag, day ordinal))``, and Parquet is written with fixed
options, so the same arguments give byte-identical files. Large corpora are rendered in
fixed-size blocks with vectorised Arrow string kernels, which keeps memory bounded and
makes a corpus row independent of how the corpus is batched or sharded.

The catalogue's words (categories, brands, attribute values) are data, in
:mod:`embedfresh.ml.data.catalogue`; this module is the code that draws from them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import math
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.catalogue import (
    ATTRIBUTE_KINDS,
    AUDIENCES,
    BRANDS,
    BUDGET_WORDS,
    CATEGORIES,
    COLOR,
    MATERIAL,
    NICE_PRICES,
    PREMIUM_WORDS,
    RELATED_PAIRS,
    SIZE,
    STYLE,
    USE,
    WARRANTY_YEARS,
)
from embedfresh.ml.data.judgments import write_spec
from embedfresh.ml.data.schema import (
    CORPUS_SCHEMA,
    DEMO_FEATURES,
    DOC_TEXT,
    JUDGMENTS_SCHEMA,
    demo_pair_schema,
)

log = logging.getLogger(__name__)


# The catalogue's prices as an array, for nearest-price lookups.
_NICE_PRICES = np.array(NICE_PRICES, dtype=np.float64)

# Intents of a query.
_NO_INTENT, _BUDGET, _PREMIUM = 0, 1, 2

# Sizes and id ranges.
CATALOGUE_SIZE = 24_000
_CORPUS_BLOCK_ROWS = 65_536
_PRODUCT_ID_BASE = 10_000_000
# Train query ids are (day ordinal << 24) + i, below 2**44; eval ids live far above.
_QUERY_INDEX_BITS = 24
_EVAL_QUERY_ID_BASE = 1 << 50
_JUDGED_QUERY_ID_BASE = 1 << 51
CANDIDATES_PER_QUERY = 8
_TRENDING_CATEGORIES = 3


# --------------------------------------------------------------------------------------
# Derived lookup tables (built once at import, deterministic)
# --------------------------------------------------------------------------------------


def _vocabulary(kind: int) -> tuple[str, ...]:
    """All values of one attribute kind across categories, in first-seen order."""
    return tuple(dict.fromkeys(v for c in CATEGORIES for v in c.values(kind)))


_VOCAB: tuple[tuple[str, ...], ...] = tuple(_vocabulary(k) for k in range(len(ATTRIBUTE_KINDS)))
_VOCAB_INDEX = tuple({v: i for i, v in enumerate(vocab)} for vocab in _VOCAB)
_MAX_VOCAB = max(len(v) for v in _VOCAB)
_N_CAT = len(CATEGORIES)
_CAT_INDEX = {c.key: i for i, c in enumerate(CATEGORIES)}


def _padded(rows: Sequence[Sequence[int]], fill: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Ragged int lists as a (len, max) matrix plus lengths, for vectorised sampling."""
    width = max(1, max(len(r) for r in rows))
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, np.array([len(r) for r in rows], dtype=np.int64)


# Per category and kind: the global ids of its values (padded) and how many there are.
_KIND_TABLES = [
    _padded([[_VOCAB_INDEX[k][v] for v in c.values(k)] for c in CATEGORIES])
    for k in range(len(ATTRIBUTE_KINDS))
]
_CAT_VALUES = tuple(values for values, _ in _KIND_TABLES)
_CAT_VALUE_COUNT = tuple(counts for _, counts in _KIND_TABLES)
_KIND_VALUE_COUNT = np.stack(_CAT_VALUE_COUNT)  # (kind, category)
_NOUNS: tuple[str, ...] = tuple(n for c in CATEGORIES for n in c.nouns)
_CAT_NOUNS, _CAT_NOUN_COUNT = _padded([[_NOUNS.index(n) for n in c.nouns] for c in CATEGORIES])
_QUERY_NOUNS: tuple[str, ...] = tuple(
    n.lower() for c in CATEGORIES for n in (*c.nouns, *c.query_nouns)
)
_CAT_QUERY_NOUNS, _CAT_QUERY_NOUN_COUNT = _padded(
    [[_QUERY_NOUNS.index(n.lower()) for n in (*c.nouns, *c.query_nouns)] for c in CATEGORIES]
)
_FEATURE_PHRASES: tuple[str, ...] = tuple(dict.fromkeys(f for c in CATEGORIES for f in c.features))
_CAT_FEATURES, _CAT_FEATURE_COUNT = _padded(
    [[_FEATURE_PHRASES.index(f) for f in c.features] for c in CATEGORIES]
)
_DOMAINS: tuple[str, ...] = tuple(dict.fromkeys(c.domain for c in CATEGORIES))
_CAT_DOMAIN = np.array([_DOMAINS.index(c.domain) for c in CATEGORIES], dtype=np.int64)
_DOMAIN_BRANDS, _DOMAIN_BRAND_COUNT = _padded(
    [[i for i, b in enumerate(BRANDS) if b[1] == d] for d in _DOMAINS]
)
_BRAND_TIER = np.array([b[2] for b in BRANDS], dtype=np.int64)
_CAT_AUDIENCE = np.array([c.audience for c in CATEGORIES], dtype=bool)
_CAT_LOG_MEDIAN = np.log(np.array([c.price_median for c in CATEGORIES]))
_CAT_SIGMA = np.array([c.price_sigma for c in CATEGORIES])


def _related_matrix() -> np.ndarray:
    related = np.zeros((_N_CAT, _N_CAT), dtype=bool)
    for a, b in RELATED_PAIRS:
        related[_CAT_INDEX[a], _CAT_INDEX[b]] = related[_CAT_INDEX[b], _CAT_INDEX[a]] = True
    return related


_RELATED = _related_matrix()
_CAT_RELATED, _CAT_RELATED_COUNT = _padded([np.flatnonzero(r).tolist() for r in _RELATED])


def _check_vocabulary() -> None:
    """Fail at import if the tables above break the generator's assumptions."""
    for c in CATEGORIES:
        for kind in (COLOR, MATERIAL, USE, STYLE):
            if not c.values(kind):
                raise ValueError(f"category {c.key} needs at least one {ATTRIBUTE_KINDS[kind]}")
    if int(_CAT_RELATED_COUNT.min()) == 0:
        raise ValueError("every category needs a related category (hard negatives)")
    if len(set(_QUERY_NOUNS)) != len(_QUERY_NOUNS):
        raise ValueError("a noun must name one category only")


_check_vocabulary()


# --------------------------------------------------------------------------------------
# Random streams
# --------------------------------------------------------------------------------------


def _rng(seed: int, stream: str, index: int = 0) -> np.random.Generator:
    """An independent stream per (seed, purpose, day or block); crc32 is stable, hash() not."""
    tag = zlib.crc32(stream.encode("utf-8"))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, tag, index])))


def _pick(
    rng: np.random.Generator, table: np.ndarray, counts: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One uniform entry of ``table[row, :counts[row]]`` per row: (position, value).

    Rows with a zero count give position 0 and value -1.
    """
    n = counts[rows]
    pos = np.floor(rng.random(len(rows)) * np.maximum(n, 1)).astype(np.int64)
    value = np.where(n > 0, table[rows, pos], -1)
    return pos, value


# --------------------------------------------------------------------------------------
# Products
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Products:
    """Columnar products: codes into the vocabulary tables plus dense features."""

    category: np.ndarray
    noun: np.ndarray  # index into _NOUNS
    audience: np.ndarray  # index into AUDIENCES, -1 for none
    brand: np.ndarray
    attrs: np.ndarray  # (n, kinds) global value ids, -1 where not applicable
    feature: np.ndarray  # index into _FEATURE_PHRASES
    lead_template: np.ndarray
    tail_template: np.ndarray
    warranty: np.ndarray
    price: np.ndarray
    rating: np.ndarray
    review_count: np.ndarray
    discount: np.ndarray
    in_stock: np.ndarray
    days_since_listed: np.ndarray

    def __len__(self) -> int:
        return len(self.category)

    def features(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name, _ in DEMO_FEATURES}


def _make_products(rng: np.random.Generator, n: int) -> _Products:
    """Draw ``n`` products: category, wording, attributes, then prices and reviews."""
    cat = rng.integers(0, _N_CAT, n)
    _, noun = _pick(rng, _CAT_NOUNS, _CAT_NOUN_COUNT, cat)
    audience = np.where(_CAT_AUDIENCE[cat], rng.integers(0, len(AUDIENCES), n), -1)
    _, brand = _pick(rng, _DOMAIN_BRANDS, _DOMAIN_BRAND_COUNT, _CAT_DOMAIN[cat])
    attrs = np.empty((n, len(ATTRIBUTE_KINDS)), dtype=np.int64)
    size_rank = np.zeros(n)
    for kind in range(len(ATTRIBUTE_KINDS)):
        pos, attrs[:, kind] = _pick(rng, _CAT_VALUES[kind], _CAT_VALUE_COUNT[kind], cat)
        if kind == SIZE:
            # Centred position in the smallest-first size list: bigger costs more.
            size_rank = pos - (np.maximum(_CAT_VALUE_COUNT[kind][cat], 1) - 1) / 2.0
    _, feature = _pick(rng, _CAT_FEATURES, _CAT_FEATURE_COUNT, cat)
    tier = _BRAND_TIER[brand]
    return _Products(
        category=cat,
        noun=noun,
        audience=audience,
        brand=brand,
        attrs=attrs,
        feature=feature,
        lead_template=rng.integers(0, 3, n),
        tail_template=rng.choice(4, size=n, p=[0.3, 0.3, 0.2, 0.2]),
        warranty=rng.integers(0, len(WARRANTY_YEARS), n),
        **_draw_features(rng, cat, tier, size_rank),
    )


def _draw_features(
    rng: np.random.Generator, cat: np.ndarray, tier: np.ndarray, size_rank: np.ndarray
) -> dict[str, np.ndarray]:
    """Dense features; brand tier moves price and rating together, as in real catalogues."""
    n = len(cat)
    log_price = (
        _CAT_LOG_MEDIAN[cat]
        + np.array([-0.35, 0.0, 0.45])[tier]
        + 0.12 * size_rank
        + rng.normal(0.0, 1.0, n) * _CAT_SIGMA[cat]
    )
    # Retail prices end in .99.
    price = np.maximum(np.floor(np.exp(log_price)), 4.0) + 0.99
    mixture_low = rng.random(n) < 0.12
    rating = np.where(
        mixture_low,
        rng.normal(3.0, 0.6, n),
        rng.normal(4.15, 0.35, n) + np.array([-0.2, 0.0, 0.2])[tier],
    )
    rating = np.round(np.clip(rating, 1.0, 5.0), 1)
    review_count = np.floor(rng.lognormal(3.6 + 0.4 * tier, 1.6, n))
    discounted = rng.random(n) < 0.45
    discount = np.where(discounted, np.round(rng.uniform(0.05, 0.6, n) / 0.05) * 0.05, 0.0)
    return {
        "price": price,
        "rating": rating,
        "review_count": review_count,
        "discount": np.clip(discount, 0.0, 0.6),
        "in_stock": (rng.random(n) < 0.9).astype(np.float64),
        "days_since_listed": np.minimum(np.floor(rng.exponential(300.0, n)), 3650.0),
    }


def _lower(phrase: str) -> str:
    """Lower-case a phrase for running text, keeping acronyms (TPE, BPA, GB) intact."""
    return re.sub(
        r"[A-Za-z']+", lambda m: m[0] if m[0].isupper() and len(m[0]) > 1 else m[0].lower(), phrase
    )


def _capitalised(phrase: str) -> str:
    return phrase[:1].upper() + phrase[1:]


def _take(table: Sequence[str], index: np.ndarray) -> pa.Array:
    """Vectorised lookup of strings; index -1 gives the empty string."""
    values = pa.array([*table, ""], pa.string())
    return pc.take(values, pa.array(np.where(index < 0, len(table), index)))


def _join(*parts: pa.Array | str) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _render_titles(p: _Products) -> pa.Array:
    """``Brand [Audience ]Style [Size ]Noun, Color``."""
    return _join(
        _take([b[0] + " " for b in BRANDS], p.brand),
        _take(AUDIENCES, p.audience),
        _take([s + " " for s in _VOCAB[STYLE]], p.attrs[:, STYLE]),
        _take([s + " " for s in _VOCAB[SIZE]], p.attrs[:, SIZE]),
        _take(_NOUNS, p.noun),
        _take([", " + c for c in _VOCAB[COLOR]], p.attrs[:, COLOR]),
    )


def _render_descriptions(p: _Products) -> pa.Array:
    """One or two sentences naming material, use and a feature, from a few templates."""
    noun = _take([_lower(n) for n in _NOUNS], p.noun)
    material = _take([_lower(m) for m in _VOCAB[MATERIAL]], p.attrs[:, MATERIAL])
    material_cap = _take([_capitalised(_lower(m)) for m in _VOCAB[MATERIAL]], p.attrs[:, MATERIAL])
    use = _take(_VOCAB[USE], p.attrs[:, USE])
    style = _take([_capitalised(_lower(s)) for s in _VOCAB[STYLE]], p.attrs[:, STYLE])
    feature = _take(_FEATURE_PHRASES, p.feature)
    lead = pc.choose(
        pa.array(p.lead_template.astype(np.int8)),
        _join(material_cap, " ", noun, " designed for ", use, "."),
        _join(style, " ", noun, " made of ", material, ", great for ", use, "."),
        _join("Made of ", material, " and built for ", use, "."),
    )
    tail = pc.choose(
        pa.array(p.tail_template.astype(np.int8)),
        _take((), np.full(len(p), -1)),  # no second sentence
        _join(" Features ", feature, "."),
        _join(
            " Includes ", feature, " and a ", _take(WARRANTY_YEARS, p.warranty), "-year warranty."
        ),
        _join(" Comes with ", feature, "."),
    )
    return _join(lead, tail)


def _texts(titles: pa.Array, descriptions: pa.Array) -> pa.Array:
    """A product's text as the encoder sees it: ``{title}. {description}``, the title
    alone when there is no description (the corpus ``text`` and the pairs' ``doc_text``)."""
    joined = pc.binary_join_element_wise(titles, descriptions, ". ")
    return pc.if_else(pc.equal(descriptions, ""), titles, joined)


# --------------------------------------------------------------------------------------
# The catalogue of a seed
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Catalogue:
    products: _Products
    ids: np.ndarray
    titles: pa.Array
    descriptions: pa.Array
    # Products sorted by (category) and by (category, kind, value), for group sampling.
    by_category: np.ndarray
    category_start: np.ndarray
    category_count: np.ndarray
    group_codes: np.ndarray
    group_start: np.ndarray
    group_count: np.ndarray
    group_members: np.ndarray

    def texts(self) -> pa.Array:
        return _texts(self.titles, self.descriptions)


def _group_code(cat: np.ndarray, kind: np.ndarray | int, value: np.ndarray) -> np.ndarray:
    return (cat * len(ATTRIBUTE_KINDS) + kind) * _MAX_VOCAB + value


@functools.lru_cache(maxsize=4)
def _catalogue(seed: int) -> _Catalogue:
    """The fixed catalogue of ``seed``; every day's partition samples from it."""
    products = _make_products(_rng(seed, "catalogue"), CATALOGUE_SIZE)
    by_category = np.argsort(products.category, kind="stable")
    category_count = np.bincount(products.category, minlength=_N_CAT)
    category_start = np.concatenate([[0], np.cumsum(category_count)[:-1]])

    kinds = np.broadcast_to(np.arange(len(ATTRIBUTE_KINDS)), products.attrs.shape)
    members = np.broadcast_to(np.arange(CATALOGUE_SIZE)[:, None], products.attrs.shape)
    valid = products.attrs >= 0
    codes = _group_code(products.category[:, None], kinds, products.attrs)[valid]
    order = np.argsort(codes, kind="stable")
    codes, group_members = codes[order], members[valid][order]
    group_codes, group_start, group_count = np.unique(codes, return_index=True, return_counts=True)
    return _Catalogue(
        products=products,
        ids=_PRODUCT_ID_BASE + np.arange(CATALOGUE_SIZE, dtype=np.int64),
        titles=_render_titles(products),
        descriptions=_render_descriptions(products),
        by_category=by_category,
        category_start=category_start,
        category_count=category_count,
        group_codes=group_codes,
        group_start=group_start,
        group_count=group_count,
        group_members=group_members,
    )


def _sample_in_category(
    rng: np.random.Generator, cat: _Catalogue, category: np.ndarray
) -> np.ndarray:
    pos = np.floor(rng.random(len(category)) * cat.category_count[category]).astype(np.int64)
    return cat.by_category[cat.category_start[category] + pos]


def _sample_in_group(
    rng: np.random.Generator,
    cat: _Catalogue,
    category: np.ndarray,
    kind: np.ndarray,
    value: np.ndarray,
) -> np.ndarray:
    """A product of ``category`` whose ``kind`` is ``value``; any of the category if none."""
    codes = _group_code(category, np.maximum(kind, 0), np.maximum(value, 0))
    slot = np.clip(np.searchsorted(cat.group_codes, codes), 0, len(cat.group_codes) - 1)
    found = (cat.group_codes[slot] == codes) & (kind >= 0) & (value >= 0)
    pos = np.floor(rng.random(len(category)) * cat.group_count[slot]).astype(np.int64)
    in_group = cat.group_members[cat.group_start[slot] + pos]
    return np.where(found, in_group, _sample_in_category(rng, cat, category))


# --------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Queries:
    category: np.ndarray
    noun: np.ndarray  # index into _QUERY_NOUNS
    kind: np.ndarray  # attribute kind, -1 for none
    value: np.ndarray  # global value id, -1 for none
    intent: np.ndarray
    explicit_limit: np.ndarray  # "under $X" amount, 0 when the budget is only implied
    budget_threshold: np.ndarray
    wording: np.ndarray  # which intent phrase

    def __len__(self) -> int:
        return len(self.category)


def _sample_queries(rng: np.random.Generator, n: int, category_weights: np.ndarray) -> _Queries:
    category = rng.choice(_N_CAT, size=n, p=category_weights / category_weights.sum())
    # Any wording of the category, and a shopper-only synonym a third of the time on
    # top, so that matching a query to a title needs more than shared words.
    _, noun = _pick(rng, _CAT_QUERY_NOUNS, _CAT_QUERY_NOUN_COUNT, category)
    shopper = rng.random(n) < 0.33
    n_title = _CAT_NOUN_COUNT[category]
    n_shopper = _CAT_QUERY_NOUN_COUNT[category] - n_title
    shopper_pos = n_title + np.floor(rng.random(n) * n_shopper).astype(np.int64)
    noun = np.where(shopper & (n_shopper > 0), _CAT_QUERY_NOUNS[category, shopper_pos], noun)

    kind = rng.integers(0, len(ATTRIBUTE_KINDS), n)
    # A kind the category lacks (sizes of shoes) falls back to color, which all have.
    kind = np.where(_KIND_VALUE_COUNT[kind, category] > 0, kind, COLOR)
    kind = np.where(rng.random(n) < 0.65, kind, -1)
    value = np.full(n, -1, dtype=np.int64)
    for k in range(len(ATTRIBUTE_KINDS)):
        _, v = _pick(rng, _CAT_VALUES[k], _CAT_VALUE_COUNT[k], category)
        value = np.where(kind == k, v, value)

    intent = rng.choice(3, size=n, p=[0.45, 0.32, 0.23])
    median = np.exp(_CAT_LOG_MEDIAN[category])
    explicit = (intent == _BUDGET) & (rng.random(n) < 0.45)
    asked = median * rng.choice([0.6, 0.8, 1.0, 1.25], size=n)
    nearest = np.abs(np.log(_NICE_PRICES)[None, :] - np.log(asked)[:, None]).argmin(axis=1)
    explicit_limit = np.where(explicit, _NICE_PRICES[nearest], 0.0)
    # "cheap" means cheaper than usual for the category; "under $X" means under X.
    budget_threshold = np.where(explicit, explicit_limit, median * 0.85)
    return _Queries(
        category=category,
        noun=noun,
        kind=kind,
        value=value,
        intent=intent,
        explicit_limit=explicit_limit,
        budget_threshold=budget_threshold,
        wording=rng.integers(0, 1 << 16, n),
    )


def _query_text(q: _Queries, i: int) -> str:
    noun = _QUERY_NOUNS[q.noun[i]]
    kind = int(q.kind[i])
    if kind == USE:
        phrase = f"{noun} for {_VOCAB[USE][q.value[i]]}"
    elif kind >= 0:
        phrase = f"{_lower(_VOCAB[kind][q.value[i]])} {noun}"
    else:
        phrase = noun
    intent, wording = int(q.intent[i]), int(q.wording[i])
    if intent == _BUDGET and q.explicit_limit[i] > 0:
        return f"{phrase} under ${int(q.explicit_limit[i])}"
    if intent == _BUDGET:
        word = BUDGET_WORDS[wording % len(BUDGET_WORDS)]
        return f"{phrase} on a budget" if wording % 7 == 0 else f"{word} {phrase}"
    if intent == _PREMIUM:
        return f"{PREMIUM_WORDS[wording % len(PREMIUM_WORDS)]} {phrase}"
    return phrase


# --------------------------------------------------------------------------------------
# Candidates and labels
# --------------------------------------------------------------------------------------

# Candidate slots: same category with the asked attribute, same category, related
# category sharing the attribute (hard negative), any other category (easy negative).
_SAME_ATTR, _SAME, _RELATED_SLOT, _OTHER = range(4)
_SLOT_P = (0.3, 0.27, 0.2, 0.23)


def _sample_candidates(
    rng: np.random.Generator, cat: _Catalogue, q: _Queries, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """(query index, product index) per example row."""
    qi = np.arange(rows, dtype=np.int64) // CANDIDATES_PER_QUERY
    qcat, kind, value = q.category[qi], q.kind[qi], q.value[qi]
    slot = rng.choice(len(_SLOT_P), size=rows, p=_SLOT_P)
    _, related = _pick(rng, _CAT_RELATED, _CAT_RELATED_COUNT, qcat)
    other = (qcat + rng.integers(1, _N_CAT, rows)) % _N_CAT
    same_attr = _sample_in_group(rng, cat, qcat, kind, value)
    same = _sample_in_category(rng, cat, qcat)
    hard = _sample_in_group(rng, cat, related, kind, value)
    easy = _sample_in_category(rng, cat, other)
    product = np.choose(slot, [same_attr, same, hard, easy])
    return qi, _without_repeats(rng, cat, qi, product, qcat)


def _without_repeats(
    rng: np.random.Generator, cat: _Catalogue, qi: np.ndarray, product: np.ndarray, qcat: np.ndarray
) -> np.ndarray:
    """Replace a product shown twice for one query by an easy negative.

    Small attribute groups make repeats likely, and a ranking metric over a list that
    holds one product twice is meaningless; the reader refuses a (query_id, doc_id)
    pair that occurs twice (:data:`embedfresh.ml.data.reader.ROW_KEY`). Two rounds are
    the most measured (200,000 rows a day, five seeds); the bound only stops a bug.
    """
    product = product.copy()
    for _ in range(64):
        key = qi * CATALOGUE_SIZE + product
        order = np.argsort(key, kind="stable")
        repeat = np.zeros(len(key), dtype=bool)
        repeat[order[1:]] = key[order][1:] == key[order][:-1]
        if not repeat.any():
            return product
        other = (qcat[repeat] + rng.integers(1, _N_CAT, int(repeat.sum()))) % _N_CAT
        product[repeat] = _sample_in_category(rng, cat, other)
    raise RuntimeError("a product still repeats for a query after 64 redraws")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


_UNOBSERVED_NOISE = 0.8


def _expected_logit(p: _Products, q: _Queries, qi: np.ndarray, trending: np.ndarray) -> np.ndarray:
    """The log-odds that a shopper finds product ``p`` relevant to query ``q``, before
    the shopper's own taste (which no column records, and keeps the best possible
    accuracy below 90%): what a judge of the pair grades.

    Text semantics dominate (category, then attribute); within a category the dense
    features decide through interactions with the query's intent. Aligned 1-D pairs, or
    a grid: ``qi`` of shape (queries, 1) against products whose columns are (1, products)
    (``attrs`` (1, products, kinds)), giving (queries, products).
    """
    qcat, kind, value, intent = q.category[qi], q.kind[qi], q.value[qi], q.intent[qi]
    same = p.category == qcat
    related = _RELATED[qcat, p.category]
    has_attr = kind >= 0
    asked = np.take_along_axis(p.attrs, np.maximum(kind, 0)[..., None], -1)[..., 0]
    match = has_attr & (asked == value)
    log_reviews = np.log1p(p.review_count)

    logit = np.where(same, 1.8, np.where(related, -3.2, -5.0))
    logit += np.where(same & has_attr, np.where(match, 1.2, -2.6), 0.0)
    # Social proof: a high rating means more when many reviews back it.
    logit += 0.3 * (p.rating - 4.0) * log_reviews
    over_budget = np.log(p.price / q.budget_threshold[qi])
    logit += np.where(intent == _BUDGET, 1.0 - 5.0 * _sigmoid(8.0 * over_budget), 0.0)
    logit += np.where(intent == _PREMIUM, 2.2 * (p.rating - 4.2) + 0.25 * (log_reviews - 4.0), 0.0)
    logit += np.where(p.in_stock > 0, 0.0, -2.2)
    logit += 0.8 * p.discount - 0.05 * np.log1p(p.days_since_listed)
    logit += np.where(trending[p.category], 0.3, 0.0)
    return logit


# --------------------------------------------------------------------------------------
# Examples
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Examples:
    table: pa.Table
    probability: np.ndarray
    expected: np.ndarray
    """Each pair's probability of relevance before the shopper's own taste."""
    same_category: np.ndarray


def _subset(p: _Products, index: np.ndarray) -> _Products:
    return _Products(**{f.name: getattr(p, f.name)[index] for f in dataclasses.fields(p)})


def _examples(
    seed: int, rng: np.random.Generator, rows: int, query_id_base: int, trending: np.ndarray
) -> _Examples:
    _check_positive(rows, "rows")
    n_queries = -(-rows // CANDIDATES_PER_QUERY)
    if n_queries >= 1 << _QUERY_INDEX_BITS:
        raise BadInputError(f"rows={rows} is too many for one partition")
    cat = _catalogue(seed)
    queries = _sample_queries(rng, n_queries, np.where(trending, 2.5, 1.0))
    qi, pi = _sample_candidates(rng, cat, queries, rows)
    products = _subset(cat.products, pi)
    logit = _expected_logit(products, queries, qi, trending)
    probability = _sigmoid(logit + rng.normal(0.0, _UNOBSERVED_NOISE, rows))
    label = (rng.random(rows) < probability).astype(np.int8)

    texts = pa.array([_query_text(queries, i) for i in range(n_queries)], pa.string())
    product_index = pa.array(pi)
    columns: dict[str, Any] = {
        "query_id": pa.array(query_id_base + qi, pa.int64()),
        "query": pc.take(texts, pa.array(qi)),
        "doc_id": pa.array(cat.ids[pi], pa.int64()),
        DOC_TEXT: _texts(
            pc.take(cat.titles, product_index), pc.take(cat.descriptions, product_index)
        ),
        **{k: pa.array(v.astype(np.float32)) for k, v in products.features().items()},
        "label": pa.array(label),
    }
    schema = demo_pair_schema()
    table = pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
    return _Examples(table, probability, _sigmoid(logit), products.category == queries.category[qi])


def _trending(seed: int, day: dt.date) -> np.ndarray:
    """The categories in fashion on ``day``: a small day-to-day drift of the data."""
    rng = _rng(seed, "trend", day.toordinal())
    out = np.zeros(_N_CAT, dtype=bool)
    out[rng.choice(_N_CAT, size=_TRENDING_CATEGORIES, replace=False)] = True
    return out


def _train_examples(seed: int, day: dt.date, rows: int) -> _Examples:
    _check_seed(seed)
    base = day.toordinal() << _QUERY_INDEX_BITS
    return _examples(seed, _rng(seed, "train", day.toordinal()), rows, base, _trending(seed, day))


def _eval_examples(seed: int, rows: int) -> _Examples:
    _check_seed(seed)
    # No trend: the held-out split stays the same whichever day a model is trained on.
    return _examples(
        seed, _rng(seed, "eval"), rows, _EVAL_QUERY_ID_BASE, np.zeros(_N_CAT, dtype=bool)
    )


def generate_partition(seed: int, day: dt.date, rows: int) -> pa.Table:
    """The training examples of ``day``: exactly ``rows`` rows of the demo's pairs
    (:func:`~embedfresh.ml.data.schema.demo_pair_schema`)."""
    return _train_examples(seed, day, rows).table


def generate_eval(seed: int, rows: int) -> pa.Table:
    """The fixed held-out split; its query ids never occur in a training partition."""
    return _eval_examples(seed, rows).table


# --------------------------------------------------------------------------------------
# Judgments
# --------------------------------------------------------------------------------------

#: Grades from a pair's expected probability of relevance (before a shopper's own
#: taste): below the first edge 0 (Irrelevant), then 1 (Complement), 2 (Substitute),
#: 3 (Exact), as ESCI names its grades (docs/DATA.md).
GRADE_EDGES = (0.5, 0.7, 0.85)
# Queries judged over the corpus per block: bounds memory to block x catalogue pairs.
_JUDGE_BLOCK = 64


def grade_of(probability: np.ndarray) -> np.ndarray:
    """Grades 0-3 of expected probabilities of relevance (:data:`GRADE_EDGES`)."""
    return np.digitize(probability, GRADE_EDGES).astype(np.int8)


def generate_judgments(seed: int, queries: int, corpus_rows: int) -> pa.Table:
    """Complete graded judgments of ``queries`` held-out queries over the first
    ``corpus_rows`` products of the corpus: every (query, product) pair graded by the
    generator's own relevance model (the catalogue's products and those beyond it),
    rows of grade 0 left out (a split marked complete counts an unlisted document as
    grade 0). Queries whose products all grade 0 have no row. Query ids never occur in a
    training partition or the eval split. Costs queries x corpus rows pair gradings
    (about 1 s per 1,000 queries over the 24,000-product catalogue).
    """
    _check_seed(seed)
    _check_positive(queries, "judged queries")
    _check_positive(corpus_rows, "corpus rows")
    q = _sample_queries(_rng(seed, "judged"), queries, np.ones(_N_CAT))
    no_trend = np.zeros(_N_CAT, dtype=bool)
    qids, dids, grades = [], [], []
    for ids, products in _corpus_products(seed, corpus_rows):
        row = _Products(  # every product as one row of the grid
            **{f.name: getattr(products, f.name)[None] for f in dataclasses.fields(products)}
        )
        for start in range(0, queries, _JUDGE_BLOCK):
            block = np.arange(start, min(start + _JUDGE_BLOCK, queries), dtype=np.int64)[:, None]
            grade = grade_of(_sigmoid(_expected_logit(row, q, block, no_trend)))
            qi, pi = np.nonzero(grade)
            qids.append(block[qi, 0])
            dids.append(ids[pi])
            grades.append(grade[qi, pi])
    qi, doc = np.concatenate(qids), np.concatenate(dids)
    order = np.lexsort((doc, qi))
    qi, doc, grade = qi[order], doc[order], np.concatenate(grades)[order]
    texts = pa.array([_query_text(q, i) for i in range(queries)], pa.string())
    return pa.table(
        {
            "query_id": pa.array(_JUDGED_QUERY_ID_BASE + qi, pa.int64()),
            "query": pc.take(texts, pa.array(qi)),
            "doc_id": pa.array(doc, pa.int64()),
            "grade": pa.array(grade, pa.int8()),
        },
        schema=JUDGMENTS_SCHEMA,
    )


def _corpus_products(seed: int, rows: int) -> Iterator[tuple[np.ndarray, _Products]]:
    """The first ``rows`` products of the corpus as (ids, products) pieces: the
    catalogue's, then the blocks drawn beyond it (:func:`_extra_block`'s)."""
    catalogue = _catalogue(seed)
    head = min(rows, CATALOGUE_SIZE)
    yield catalogue.ids[:head], _subset(catalogue.products, np.arange(head))
    for block in range(math.ceil((rows - head) / _CORPUS_BLOCK_ROWS)):
        ids, products = _extra_products(seed, block)
        take = min(rows - head - block * _CORPUS_BLOCK_ROWS, _CORPUS_BLOCK_ROWS)
        yield ids[:take], _subset(products, np.arange(take))


def sparse_judgments(seed: int, eval_rows: int) -> pa.Table:
    """Judgments shaped like a team's labels: the eval split's own candidates only (a
    few per query, grade 0 included), graded as :func:`generate_judgments` grades."""
    ex = _eval_examples(seed, eval_rows)
    grade = grade_of(ex.expected)
    t = ex.table
    return pa.table(
        {
            "query_id": t.column("query_id"),
            "query": t.column("query"),
            "doc_id": t.column("doc_id"),
            "grade": pa.array(grade, pa.int8()),
        },
        schema=JUDGMENTS_SCHEMA,
    )


# --------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------


def _extra_products(seed: int, block: int) -> tuple[np.ndarray, _Products]:
    """Block ``block`` of products beyond the catalogue, drawn from its own stream."""
    products = _make_products(_rng(seed, "corpus-extra", block), _CORPUS_BLOCK_ROWS)
    start = _PRODUCT_ID_BASE + CATALOGUE_SIZE + block * _CORPUS_BLOCK_ROWS
    return start + np.arange(_CORPUS_BLOCK_ROWS, dtype=np.int64), products


def _extra_block(seed: int, block: int) -> tuple[np.ndarray, pa.Array]:
    """Ids and texts of block ``block`` of products beyond the catalogue."""
    ids, products = _extra_products(seed, block)
    return ids, _texts(_render_titles(products), _render_descriptions(products))


def _corpus_pieces(seed: int, rows: int) -> Iterator[pa.RecordBatch]:
    catalogue = _catalogue(seed)
    head = min(rows, CATALOGUE_SIZE)
    yield pa.record_batch(
        [pa.array(catalogue.ids[:head]), catalogue.texts().slice(0, head)], schema=CORPUS_SCHEMA
    )
    for block in range(math.ceil((rows - head) / _CORPUS_BLOCK_ROWS)):
        ids, texts = _extra_block(seed, block)
        take = min(rows - head - block * _CORPUS_BLOCK_ROWS, _CORPUS_BLOCK_ROWS)
        yield pa.record_batch([pa.array(ids[:take]), texts.slice(0, take)], schema=CORPUS_SCHEMA)


def iter_corpus_batches(seed: int, rows: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The corpus as record batches of ``batch_rows`` rows (the last may be shorter).

    Catalogue products come first, then generated ones; a row's content does not depend
    on ``batch_rows``, and at most one block plus one batch is held in memory.
    """
    _check_seed(seed)
    _check_positive(rows, "corpus rows")
    _check_positive(batch_rows, "corpus batch rows")
    pending: list[pa.RecordBatch] = []
    held = 0
    for piece in _corpus_pieces(seed, rows):
        offset = 0
        while offset < piece.num_rows:
            take = min(batch_rows - held, piece.num_rows - offset)
            pending.append(piece.slice(offset, take))
            held += take
            offset += take
            if held == batch_rows:
                yield pa.concat_batches(pending)
                pending, held = [], 0
    if pending:
        yield pa.concat_batches(pending)


def generate_corpus(seed: int, rows: int) -> pa.Table:
    """The whole corpus of ``rows`` rows of CORPUS_SCHEMA in one table."""
    batches = list(iter_corpus_batches(seed, rows, _CORPUS_BLOCK_ROWS))
    return pa.Table.from_batches(batches, schema=CORPUS_SCHEMA)


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


def parquet_bytes(table: pa.Table) -> bytes:
    """Serialise with fixed options so equal tables give equal bytes."""
    sink = pa.BufferOutputStream()
    pq.write_table(
        table.combine_chunks(),
        sink,
        compression="zstd",
        compression_level=3,
        use_dictionary=True,
        write_statistics=True,
        row_group_size=65_536,
        version="2.6",
        data_page_version="1.0",
        store_schema=True,
    )
    return sink.getvalue().to_pybytes()


def _positive_rate(table: pa.Table) -> float:
    return round(float(pc.mean(table.column("label").cast(pa.float64())).as_py()), 6)


def _write_examples(store: ArtifactStore, directory: str, table: pa.Table) -> dict[str, Any]:
    rel = f"{directory}/{layout.part_name(0)}"
    store.write_bytes(rel, parquet_bytes(table))
    return {"url": store.url(rel), "rows": table.num_rows, "positive_rate": _positive_rate(table)}


_PART = re.compile(r"part-(\d{5})\.parquet")


def _write_corpus(
    store: ArtifactStore, name: str, seed: int, rows: int, shard_rows: int
) -> dict[str, Any]:
    directory = layout.corpus(name)
    shards = []
    for index, batch in enumerate(iter_corpus_batches(seed, rows, shard_rows)):
        rel = f"{directory}/{layout.part_name(index)}"
        store.write_bytes(rel, parquet_bytes(pa.Table.from_batches([batch])))
        shards.append(store.url(rel))
    # Shards past the new end, left by an earlier larger run, would silently join the corpus.
    for stale in store.listdir(directory):
        match = _PART.fullmatch(stale)
        if match and int(match.group(1)) >= len(shards):
            log.info("removing stale corpus shard %s", store.url(f"{directory}/{stale}"))
            store.remove(f"{directory}/{stale}")
    return {"name": name, "url": store.url(directory), "rows": rows, "shards": shards}


def _write_judgments(
    store: ArtifactStore,
    name: str,
    corpus: str,
    kind: str,
    seed: int,
    queries: int,
    eval_rows: int,
    corpus_rows: int,
) -> dict[str, Any]:
    complete = kind == "complete"
    table = (
        generate_judgments(seed, queries, corpus_rows)
        if complete
        else sparse_judgments(seed, eval_rows)
    )
    directory = layout.judgments(name)
    rel = f"{directory}/{layout.part_name(0)}"
    store.write_bytes(rel, parquet_bytes(table))
    write_spec(store, name, complete, corpus)
    return {
        "url": store.url(rel),
        "rows": table.num_rows,
        "queries": len(pc.unique(table.column("query_id"))),
        "complete": complete,
    }


def write_dataset(
    store: ArtifactStore,
    name: str,
    seed: int,
    start: dt.date,
    days: int,
    train_rows: int,
    eval_rows: int,
    corpus_name: str,
    corpus_rows: int,
    corpus_shard_rows: int,
    judged_queries: int = 2000,
    judgments: str = "complete",
) -> dict[str, Any]:
    """Write ``days`` daily train partitions, the eval split, its judgments and the
    corpus shards.

    ``judgments``: ``complete`` grades ``judged_queries`` queries against every
    catalogue product of the corpus (:func:`generate_judgments`); ``sparse`` grades the
    eval split's own candidates (:func:`sparse_judgments`), as a team's labels are.
    Everything is regenerated and overwritten; the same arguments give the same bytes.
    """
    _check_seed(seed)
    for value, what in (
        (days, "days"),
        (train_rows, "train rows"),
        (eval_rows, "eval rows"),
        (corpus_rows, "corpus rows"),
        (corpus_shard_rows, "corpus shard rows"),
        (judged_queries, "judged queries"),
    ):
        _check_positive(value, what)
    layout.safe_id(name, "dataset")
    layout.safe_id(corpus_name, "corpus")
    if judgments not in ("complete", "sparse"):
        raise BadInputError(f"judgments must be complete or sparse, got {judgments!r}")

    # The demo's features, declared for the runs that train on it (docs/DATA.md).
    declaration = {"features": [list(pair) for pair in DEMO_FEATURES]}
    store.write_json(layout.dataset_declaration(name), declaration)
    train = []
    positives = 0
    for offset in range(days):
        day = start + dt.timedelta(days=offset)
        table = generate_partition(seed, day, train_rows)
        positives += int(pc.sum(table.column("label").cast(pa.int64())).as_py())
        entry = _write_examples(store, layout.dataset_partition(name, "train", day), table)
        train.append({"day": day.isoformat(), **entry})
        log.info("wrote %s (%d rows)", entry["url"], entry["rows"])
    eval_entry = _write_examples(store, layout.eval_split(name), generate_eval(seed, eval_rows))
    judgments_entry = _write_judgments(
        store, name, corpus_name, judgments, seed, judged_queries, eval_rows, corpus_rows
    )
    corpus_entry = _write_corpus(store, corpus_name, seed, corpus_rows, corpus_shard_rows)
    return {
        "dataset": name,
        "seed": seed,
        "train": train,
        "train_rows": train_rows * days,
        "positive_rate": round(positives / (train_rows * days), 6),
        "eval": eval_entry,
        "judgments": judgments_entry,
        "corpus": corpus_entry,
    }


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BadInputError(f"seed must be a non-negative integer, got {seed!r}")


def _check_positive(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadInputError(f"{what} must be a positive integer, got {value!r}")
