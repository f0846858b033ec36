"""The artifact store (:class:`ArtifactStore`) and the kinds of root it serves.

- :mod:`~embedfresh.core.storage.store`: the store itself, error translation, helpers.
- :mod:`~embedfresh.core.storage.base`: :class:`Scheme`, what one kind of root provides.
- :mod:`~embedfresh.core.storage.schemes`: the registry, URL scheme -> Scheme.
- :mod:`~embedfresh.core.storage.local` (``file://``), :mod:`~embedfresh.core.storage.s3`
  (``s3://``): the built-in schemes.
- :mod:`~embedfresh.core.storage.faults`: the reliability suite's fault points (test-only
  environment variables; off otherwise).
"""

from embedfresh.core.storage.base import Scheme, sha256_bytes
from embedfresh.core.storage.s3 import S3_MAX_ATTEMPTS, S3_RETRY_MODE, s3_retry_config
from embedfresh.core.storage.schemes import (
    BUILT_IN_SCHEMES,
    register_scheme,
    scheme_names,
    unregister_scheme,
)
from embedfresh.core.storage.store import (
    ArtifactStore,
    before_first_write,
    default_storage_options,
    is_transient,
    json_bytes,
    writing_elsewhere,
)

__all__ = [
    "BUILT_IN_SCHEMES",
    "S3_MAX_ATTEMPTS",
    "S3_RETRY_MODE",
    "ArtifactStore",
    "before_first_write",
    "default_storage_options",
    "Scheme",
    "is_transient",
    "json_bytes",
    "register_scheme",
    "s3_retry_config",
    "scheme_names",
    "sha256_bytes",
    "unregister_scheme",
    "writing_elsewhere",
]
