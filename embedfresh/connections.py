"""What the control plane's two rooms (the operators and the "Model quality" page)
share: an Airflow connection's AWS credentials as s3fs options for the artifact store.

The jobs find their credentials the way boto3 does (the container's role, the
environment). What runs in Airflow itself may be given an Airflow connection instead
(``aws_conn_id``); it is resolved here, through the Amazon provider's ``S3Hook``, so
:mod:`embedfresh.core` never learns about Airflow. The operators and the plugin import
each other never, and this module both (pyproject.toml's import contracts); it imports
Airflow's provider only inside the function, so a DAG file that imports an operator
stays light.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

#: The schemes of roots a connection's AWS credentials apply to.
AWS_SCHEMES = frozenset({"s3"})


def s3_storage_options(root: str, aws_conn_id: str | None) -> dict[str, Any] | None:
    """s3fs options for ``root`` from Airflow connection ``aws_conn_id``, resolved the way
    the provider's own ``s3://`` ObjectStoragePath does: the hook's session (keys, role,
    region; refreshed as they expire), the connection's S3 endpoint and its botocore
    ``config_kwargs``.

    ``None`` (nothing to pass) for a root of another scheme or no connection. A
    connection that does not exist leaves boto3's own credential chain, as the provider's
    hooks do (with their warning).
    """
    if not aws_conn_id or urlparse(str(root)).scheme not in AWS_SCHEMES:
        return None
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=aws_conn_id)
    options: dict[str, Any] = {"session": hook.get_session(deferrable=True)}
    if endpoint := hook.conn_config.get_service_endpoint_url(service_name="s3"):
        options["endpoint_url"] = endpoint
    if config := hook.conn_config.extra_config.get("config_kwargs"):
        options["config_kwargs"] = dict(config)
    return options
