"""Batch embeddings of a corpus with a model version (DESIGN "Batch embeddings").

``python -m jobs.embed`` embeds corpus shards (:mod:`jobs.embedding.job`);
``python -m jobs.embed_verify`` checks the result and writes the manifest
(:mod:`jobs.embedding.verify`). Kept import-light: torch is imported by the job only.
"""
