"""Measure what the artifact store's S3 retries do against injected faults: how long a
burst of errors costs, and how long the store waits before it gives up (exit 75).

Run on demand, not by pytest (it takes minutes when the faults never stop)::

    .venv/bin/python -m tests.reliability.retry_budget            # the store's defaults
    AWS_RETRY_MODE=legacy AWS_MAX_ATTEMPTS=5 .venv/bin/python -m tests.reliability.retry_budget

Prints one row per scenario: requests the proxy saw, faults it injected, seconds, and
the outcome. Uses moto's server and the fault proxy on 127.0.0.1; nothing else.
"""

from __future__ import annotations

import os
import time

from tests.reliability.fault_proxy import (
    DROP,
    INTERNAL,
    SLOW_DOWN,
    FaultPlan,
    FaultProxy,
    always,
    every,
)

OPS = 10  # write + read pairs in the burst scenarios


def main() -> None:
    import boto3
    from moto.server import ThreadedMotoServer

    from embedfresh.core.exit_codes import TransientError
    from embedfresh.core.storage import ArtifactStore, s3_retry_config

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    upstream = f"http://{host}:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    boto3.client("s3", endpoint_url=upstream).create_bucket(Bucket="retry-budget")
    print(f"retries: {s3_retry_config()}")
    print(f"{'scenario':36} {'requests':>8} {'faults':>6} {'seconds':>8}  outcome")
    with FaultProxy(upstream) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        store = ArtifactStore("s3://retry-budget/p")
        store.write_bytes("seed", b"x")

        def row(name: str, work) -> None:
            proxy.plan = FaultPlan(proxy.plan.rule)
            started = time.perf_counter()
            try:
                work()
                outcome = "ok"
            except TransientError as e:
                outcome = f"TransientError (exit 75): {str(e)[:60]}"
            seconds = time.perf_counter() - started
            injected = sum(proxy.plan.injected.values())
            print(f"{name:36} {proxy.plan.requests:>8} {injected:>6} {seconds:>8.2f}  {outcome}")

        def burst() -> None:
            for i in range(OPS):
                store.write_bytes(f"b/{i}", b"y" * 1000)
                assert store.read_bytes(f"b/{i}") == b"y" * 1000

        for name, fault in (("SlowDown", SLOW_DOWN), ("500", INTERNAL), ("dropped", DROP)):
            proxy.plan.rule = every(2, fault)
            row(f"every 2nd request {name}, {OPS} w+r", burst)
        for name, fault in (("SlowDown", SLOW_DOWN), ("500", INTERNAL)):
            proxy.plan.rule = always(fault)
            row(f"every request {name}: one write", lambda: store.write_bytes("z", b"1"))
        proxy.plan.rule = lambda method, path, n: None
        proxy.down()
        row("endpoint down: one read", lambda: store.read_bytes("seed"))
    server.stop()


if __name__ == "__main__":
    main()
