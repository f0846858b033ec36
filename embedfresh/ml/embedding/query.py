"""The query side of a release: texts embedded exactly as its corpus was.

A search service compares a query's vector with the corpus's vectors, so both must come
from the same function: the release's model version, its tokenizer and truncation
length, its pooling and Dense modules, unit normalisation, the same fast mode (int8
calibrated on the same corpus shard, or bf16) and the same compute route as the embed
job (:func:`embedfresh.ml.embedding.encode.embed_plan`). Only the prompt differs:
queries get the model's query prompt, documents its document prompt, as
sentence-transformers' ``encode_query`` and ``encode_document`` put them.

Everything is read from the release's record of how its corpus was embedded (the
manifest's ``settings``); a setting this encoder cannot repeat is refused, never
guessed::

    from embedfresh.core.releases import live_release
    from embedfresh.ml.embedding.query import ReleaseEncoder

    release = live_release(root, "search")
    encoder = ReleaseEncoder.for_release(store, release, "products")
    vectors = encoder.queries(["waterproof hiking boots"])
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from embedfresh.core import layout
from embedfresh.core.config.embedding import DEFAULT_LENGTHS, EmbedConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.releases import Release
from embedfresh.core.shards import CALIBRATION, read_corpus_shard
from embedfresh.core.storage import ArtifactStore, sha256_bytes
from embedfresh.ml.embedding.bucketing import VariableTokenizer, make_batches, padded_lengths
from embedfresh.ml.embedding.encode import embed_plan

if TYPE_CHECKING:
    from embedfresh.ml.backends import Backend

log = logging.getLogger(__name__)

TOKEN_BUDGET = EmbedConfig.model_fields["token_budget"].default


def calibration_texts(store: ArtifactStore, rel: str, prompt: str) -> list[str]:
    """The texts int8 is calibrated on: the first of corpus shard ``rel``'s, after the
    document ``prompt``, as the encoder sees them."""
    from embedfresh.ml.embedding.precision import CALIBRATION_TEXTS

    _, texts = read_corpus_shard(store, rel)
    return [prompt + t for t in texts[:CALIBRATION_TEXTS]]


def calibration_digest(texts: Sequence[str]) -> str:
    """sha256 of calibration texts, as an embedding set's settings pin them."""
    return sha256_bytes(json.dumps(list(texts), ensure_ascii=False).encode())


def vector_settings(
    spec: Any,
    max_length: int,
    quantize: str,
    backend: str,
    calibration_part: str | None = None,
    calibration_sha256: str | None = None,
) -> dict[str, Any]:
    """Every setting that changes a corpus's vectors, as the embed job records them in
    its manifest and a release's query encoder reads them back (:class:`ReleaseEncoder`):
    the truncation length, pooling, Dense modules, prompt, normalisation, fast mode and
    backend (not the batching: packed or padded, budget and buckets give the same
    vectors up to float rounding). int8 adds the corpus shard its activation scales were
    calibrated on (``calibration_part``), the sha256 of the texts (``calibration_sha256``:
    their copy beside the parts, :data:`~embedfresh.core.shards.CALIBRATION`) and its
    route."""
    settings = {
        "max_length": max_length,
        "pooling": spec.pooling_mode,
        "dense": [layer.model_dump() for layer in spec.dense or []],
        "prompt": spec.prompt("document"),
        "normalize": True,
        "quantize": quantize,
        "backend": backend,
    }
    if quantize == "int8":
        from embedfresh.ml.embedding.precision import int8_settings

        settings["int8_calibration"] = calibration_part
        if calibration_sha256 is not None:
            settings["int8_calibration_sha256"] = calibration_sha256
        settings.update(int8_settings())  # parts of the earlier dynamic route are stale
    return settings


class TextEncoder:
    """Texts to unit vectors with one encoder module, exactly as the embed job embeds a
    corpus: its tokenizer at ``max_length``, length buckets under the job's token budget
    (:func:`embedfresh.ml.embedding.encode.embed_plan`), queries after the model's query
    prompt and documents after its document prompt.

    :param packed: the embed job's packed forward on CPU/CUDA (same vectors); off for a
        model wrapped for training (FSDP), whose layers are only reached by ``embed``.
    """

    def __init__(
        self,
        encoder: Any,
        backend: Any,
        tokenizer_json: bytes,
        spec: Any,
        max_length: int,
        document_prompt: str,
        packed: bool = True,
    ) -> None:
        self.max_length = int(max_length)
        self.hidden = spec.embedding_dim
        self.backend = backend
        self.tokenizer = VariableTokenizer(tokenizer_json, self.max_length)
        self.lengths = padded_lengths(DEFAULT_LENGTHS, self.max_length)
        self.query_prompt = spec.prompt("query")
        self.document_prompt = document_prompt
        self._encoder = encoder
        self._packed = packed
        self.truncated = 0
        """Texts cut at :attr:`max_length` so far (each also logged)."""

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of ``texts`` as queries (after the model's query prompt)."""
        return self._embed([self.query_prompt + t for t in texts], "queries")

    def documents(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of ``texts`` as documents: what the corpus's vectors are."""
        return self._embed([self.document_prompt + t for t in texts], "documents")

    def _embed(self, texts: list[str], what: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.hidden), dtype=np.float32)
        token_ids, cut = self.tokenizer(texts)
        if cut:
            self.truncated += cut
            log.warning(
                "%d of %d %s are longer than %d tokens and were truncated",
                cut, len(texts), what, self.max_length,
            )  # fmt: skip
        plan = make_batches(token_ids, self.lengths, TOKEN_BUDGET)
        return embed_plan(
            self._encoder, self.backend, plan, len(texts), self.hidden, packed=self._packed
        )


class ReleaseEncoder(TextEncoder):
    """Embeds queries and documents as the corpus ``corpus`` of a release was embedded.

    :param settings: the embedding set's settings (its manifest's, as the release
        records them; :func:`vector_settings`): ``max_length``, ``pooling``, ``dense``,
        ``prompt``, ``normalize``, ``quantize``, ``backend`` (and ``int8_calibration``,
        ``int8_route``, ``int8_between_gemms``).
    :param backend: run on this backend (a name, or one built already) instead of the one
        the corpus was embedded on (logged: float rounding differs between devices).
    :raises BadInputError: the settings do not describe this version's encoder.
    """

    def __init__(
        self,
        store: ArtifactStore,
        model: str,
        version: str,
        corpus: str,
        settings: dict[str, Any],
        backend: str | Backend | None = None,
    ) -> None:
        from embedfresh.ml.backends import get_backend
        from embedfresh.ml.embedding.precision import CALIBRATION_TEXTS, fast_model
        from embedfresh.ml.model import versions

        loaded = versions.load(store, model, version)
        spec = loaded.spec
        self.model, self.version, self.corpus = model, version, corpus
        self._check(spec, settings)
        recorded = str(settings.get("backend") or "cpu")
        built = backend is not None and not isinstance(backend, str)
        device = backend if built else get_backend(backend or recorded)
        if device.name != recorded:
            log.warning(
                "the corpus of %s %s was embedded on %s; queries are embedded on %s (vectors "
                "differ by float rounding, cosine ~1e-6)",
                model, version, recorded, device.name,
            )  # fmt: skip
        document_prompt = str(settings.get("prompt") or "")
        super().__init__(
            None, device, loaded.tokenizer_json, spec, settings["max_length"], document_prompt
        )
        encoder = versions.instantiate(loaded).to(device.device)
        encoder.eval()
        self.quantize = str(settings.get("quantize") or "none")
        if self.quantize != "none":
            texts, between = None, None
            if self.quantize == "int8":
                texts = self._calibration_texts(store, settings, CALIBRATION_TEXTS)
                between = self._int8_route(settings)
            encoder, _ = fast_model(encoder, device, self.quantize, self.tokenizer, texts, between)
        self._encoder = encoder

    @classmethod
    def for_release(
        cls, store: ArtifactStore, release: Release, corpus: str, backend: str | None = None
    ) -> ReleaseEncoder:
        """The encoder of ``release``'s ``corpus`` (its version, its recorded settings)."""
        entry = release.corpus(corpus)
        return cls(store, release.model, release.version, corpus, entry.settings, backend)

    def _check(self, spec: Any, settings: dict[str, Any]) -> None:
        wanted = {
            "pooling": spec.pooling_mode,
            "dense": [layer.model_dump() for layer in spec.dense or []],
            "prompt": spec.prompt("document"),
            "normalize": True,
        }
        differ = [f"{k} {settings.get(k)!r} (the version's: {v!r})"
                  for k, v in wanted.items() if settings.get(k) != v]  # fmt: skip
        if differ or not isinstance(settings.get("max_length"), int):
            raise BadInputError(
                f"the corpus {self.corpus!r} of {self.model} {self.version} was embedded with "
                f"settings this version's encoder does not have ({'; '.join(differ) or 'no max_length'}): "
                "its query encoder cannot repeat them"
            )

    def _int8_route(self, settings: dict) -> str:
        """The recorded int8 route's layers-between-GEMMs dtype, so queries are embedded
        by the same int8 model as the corpus whatever host runs them; int8 vectors of
        another route cannot be repeated."""
        from embedfresh.ml.embedding.precision import INT8_ROUTE

        if settings.get("int8_route") != INT8_ROUTE:
            raise BadInputError(
                f"int8 embeddings of {self.corpus!r} by {self.model} {self.version} were made "
                f"by int8 route {settings.get('int8_route') or 'quantize_dynamic'!r}; this "
                f"encoder builds {INT8_ROUTE!r}: re-embed the corpus (a refresh releases it)"
            )
        return str(settings.get("int8_between_gemms") or "fp32")

    def _calibration_texts(self, store: ArtifactStore, settings: dict, n: int) -> list[str]:
        """The texts the set's int8 model was calibrated on: its copy beside the parts,
        else the corpus shard they came from while it still holds them (an evaluation
        before the set is embedded), each checked against the digest the settings pin
        (sets embedded before the pin: the shard, as it stands)."""
        part = settings.get("int8_calibration")
        if not isinstance(part, str):
            raise BadInputError(
                f"int8 embeddings of {self.corpus!r} without their calibration shard: the query "
                "encoder cannot build the same int8 model"
            )
        digest = settings.get("int8_calibration_sha256")
        rel = f"{layout.embeddings(self.model, self.version, self.corpus)}/{CALIBRATION}"
        if digest is not None and store.exists(rel):
            texts = store.read_json(rel).get("texts")
            if isinstance(texts, list) and calibration_digest(texts) == digest:
                return texts[:n]
        shard = f"{layout.corpus(self.corpus)}/{part}"
        texts = calibration_texts(store, shard, self.document_prompt) if store.exists(shard) else []
        if digest is not None and calibration_digest(texts) != digest:
            raise BadInputError(
                f"the int8 calibration texts of {self.corpus!r} by {self.model} "
                f"{self.version} are missing or differ from the sha256 its embeddings pin "
                f"({digest[:12]}...; neither {store.url(rel)} nor {store.url(shard)} holds "
                "them): the query encoder cannot build the same int8 model; re-embed the "
                "corpus (a refresh releases it)"
            )
        return texts[:n]
