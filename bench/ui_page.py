"""The "Model quality" page at a year of daily runs on S3 (moto's server), with and
without the run index.

Fills a bucket on a moto S3 server on 127.0.0.1 with ``--runs`` daily refresh runs (each
with the health, compile and gate reports of the plugin's fixture store, the gate's
written by the real gate job), a registry and one compile-cache entry, builds the run
index with the real writer (``python -m embedfresh.jobs.index_runs``' code), then loads
the page (``GET /model-quality/?model=tiny`` through FastAPI's TestClient, auth
overridden) ``--loads`` times with the index and without it, interleaved, and reports the
medians and the store requests of one load. Run on demand, never in CI; appends its
section to docs/BENCHMARKS.md (``--output -``: print only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    BENCHMARKS,
    NOISY,
    ROOT,
    command_line,
    interleaved,
    machine,
    median,
    publish,
    section,
    table,
)

FIXTURE = ROOT / "tests" / "plugin_fixtures" / "store"
MODEL = "tiny"
TARGET_S = 1.0
#: Every section of the page as JSON: the store reads of a page load, without rendering.
API = f"/api/models/{MODEL}"


def _fill(root: str, runs: int) -> None:
    from embedfresh.core.storage import ArtifactStore

    store = ArtifactStore(root)
    gate = json.loads(
        (FIXTURE / f"runs/{MODEL}/manual__2026-01-02T00:00:00+00:00/reports/gate.json").read_text()
    )
    health = json.loads((FIXTURE / f"runs/{MODEL}/health-a/reports/health.json").read_text())
    compile_ = json.loads((FIXTURE / f"runs/{MODEL}/compile-1/reports/compile.json").read_text())
    store.write_bytes(
        f"models/{MODEL}/registry.json", (FIXTURE / f"models/{MODEL}/registry.json").read_bytes()
    )

    def one(i: int) -> None:
        day = (dt.date(2026, 1, 1) + dt.timedelta(days=i)).isoformat()
        run_id = f"scheduled__{day}T00:00:00+00:00"
        for kind, doc in (("health", health), ("compile", compile_), ("gate", gate)):
            doc = {**doc, "created_at": f"{day}T01:00:00+00:00"}
            if kind == "gate":
                doc.update(run_id=run_id, verdict="FAIL" if i % 3 else "PASS")
            store.write_json(f"runs/{MODEL}/{run_id}/reports/{kind}.json", doc)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(runs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=365, help="daily runs in the store")
    parser.add_argument("--loads", type=int, default=5, help="page loads per variant")
    parser.add_argument("--output", default=str(BENCHMARKS), help="'-': print only")
    args = parser.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")

    import boto3
    from fastapi.testclient import TestClient
    from moto.server import ThreadedMotoServer

    from embedfresh.core import run_index
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.plugins.model_quality import create_app
    from embedfresh.plugins.model_quality.app import authorized_user

    machine_line = machine()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )
    started = time.perf_counter()
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="ui-bench")
        root = "s3://ui-bench/prod"
        _fill(root, args.runs)
        filled = time.perf_counter() - started
        t0 = time.perf_counter()
        built = run_index.update(ArtifactStore(root), MODEL, rebuild=True)
        rebuild_s = time.perf_counter() - t0
        index_bytes = len(ArtifactStore(root).read_bytes(f"runs/{MODEL}/_index.json"))

        app = create_app(root)
        app.dependency_overrides[authorized_user] = lambda: None
        client = TestClient(app, raise_server_exceptions=False)
        s3 = boto3.client("s3", endpoint_url=endpoint)
        index_key = f"prod/runs/{MODEL}/_index.json"
        saved = s3.get_object(Bucket="ui-bench", Key=index_key)["Body"].read()

        def load(with_index: bool, url: str = f"/?model={MODEL}"):
            def timed() -> float:
                if with_index:
                    s3.put_object(Bucket="ui-bench", Key=index_key, Body=saved)
                else:
                    s3.delete_object(Bucket="ui-bench", Key=index_key)
                t = time.perf_counter()
                r = client.get(url)
                elapsed = time.perf_counter() - t
                assert r.status_code == 200, r.text[:300]
                return elapsed

            return timed

        client.get(f"/?model={MODEL}")  # warm-up: imports, connections
        times = interleaved(
            {
                "page (HTML, charts rendered), with the run index": load(True),
                "every section as JSON, with the run index": load(True, API),
                "every section as JSON, without the index": load(False, API),
            },
            args.loads,
        )
    finally:
        server.stop()

    rows = [
        [name, args.runs, f"{median(v):.3f}", ", ".join(f"{x:.2f}" for x in v)]
        for name, v in times.items()
    ]
    with_s = median(times["page (HTML, charts rendered), with the run index"])
    text = section(
        "Model quality page at a year of runs, moto S3",
        [
            f"Command: `{command_line()}`",
            f"Machine: {machine_line}",
            f"Date: {dt.datetime.now(dt.UTC).isoformat(timespec='minutes')}; {NOISY}",
            f"Store: moto's S3 server on 127.0.0.1, {args.runs} daily runs (health, compile, "
            f"gate reports each), filled in {filled:.0f} s; index rebuilt from every report "
            f"in {rebuild_s:.1f} s ({built['runs']} runs, {index_bytes / 1024:.0f} KiB)",
            f"Target: the page in at most {TARGET_S:.0f} s at 365 runs with the index: "
            f"{'met' if with_s <= TARGET_S else 'missed'} ({with_s:.3f} s)",
        ],
        [table(["page load", "runs", "median s", f"each of {args.loads} s"], rows)],
    )
    publish(text, None if args.output == "-" else Path(args.output))


if __name__ == "__main__":
    main()
