"""Memory at scale: peak RSS of ``python -m embedfresh.jobs.embed`` for corpora of growing size.

Run on demand, not in CI::

    OMP_NUM_THREADS=2 .venv/bin/python bench/embeddings_scale.py [--rows 100000 1000000]

For each size it writes a generated product corpus (``embedfresh.ml.data.generate``, shards of
``--shard-rows`` rows) into a fresh ``file://`` store beside a ``tiny`` model version,
runs the embed job as a child process and reads that child's own peak RSS from
``os.wait4`` (``ru_maxrss``). The job streams shards, so the peak should not grow with
the corpus. Then it runs ``python -m embedfresh.jobs.embed_verify`` on those embeddings, also
a child process of its own, and reads its peak RSS the same way. Prints a Markdown table and appends it with the
command, machine and date to ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARD_PEAK = re.compile(r"shard \d+ committed: .*peak RSS ([\d.]+) MiB")
sys.path.insert(0, str(ROOT))


def write_corpus(root: str, name: str, rows: int, shard_rows: int, seed: int = 0) -> None:
    """A generated corpus of ``rows`` rows in ``part-NNNNN.parquet`` shards, and a
    committed ``tiny`` version ``v1`` (random weights) to embed it with."""
    import pyarrow as pa

    from embedfresh.core import layout
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.data.generate import iter_corpus_batches, parquet_bytes
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    store = ArtifactStore(root)
    spec = get_spec("tiny")
    if not store.exists(f"{layout.model_version('tiny', 'v1')}/COMMIT"):
        versions.publish(store, spec, "v1", cpu_state_dict(versions.build_model(spec, 0)), {})
    for i, batch in enumerate(iter_corpus_batches(seed, rows, shard_rows)):
        data = parquet_bytes(pa.Table.from_batches([batch]))
        store.write_bytes(f"{layout.corpus(name)}/{layout.part_name(i)}", data)


def run_embed(root: str, corpus: str, env: dict[str, str] | None = None) -> dict:
    """Run the embed job on ``corpus`` in a child process; its exit code, wall time,
    peak RSS (MiB, that child alone) and report."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.embed"]
    for s in (
        f"artifact_root={root}",
        "model=tiny",
        "version=v1",
        f"corpus={corpus}",
        f"run_id=scale-{corpus}",
    ):
        cmd += ["--set", s]
    t0 = time.perf_counter()
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log)
    out = proc.stdout.read()  # the job's summary names its report
    # wait4 gives this child's own rusage (RUSAGE_CHILDREN would mix every child).
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    log.seek(0)
    shard_peaks = [float(m) for m in SHARD_PEAK.findall(log.read())]
    log.close()
    result = json.loads(out) if proc.returncode == 0 else {}
    report = {}
    if result:
        from embedfresh.core import layout
        from embedfresh.core.storage import ArtifactStore

        run_id = f"scale-{corpus}"
        report = ArtifactStore(root).read_json(layout.report("tiny", run_id, "embed"))
    return {
        "returncode": proc.returncode,
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux; includes interpreter exit
        "job_peak_rss_mib": report.get("peak_rss_mib"),  # when the job returned
        "rows": result.get("rows"),
        "shard_peaks_mib": shard_peaks,  # peak so far after each committed shard
    }


def run_verify(root: str, corpus: str, env: dict[str, str] | None = None) -> dict:
    """Run ``embed_verify`` on ``corpus``'s embeddings in a child process; its exit code,
    wall time and peak RSS (MiB, ``os.wait4`` of that child alone)."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.embed_verify"]
    for s in (f"artifact_root={root}", "model=tiny", "version=v1", f"corpus={corpus}"):
        cmd += ["--set", s]
    t0 = time.perf_counter()
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    log.seek(0)
    err = log.read()[-2000:]
    log.close()
    result = json.loads(out) if proc.returncode == 0 else {"stderr": err}
    return {
        "returncode": proc.returncode,
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "rows": result.get("rows"),
        "stderr": result.get("stderr"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--shard-rows", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--output", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--write-corpus", nargs=3, metavar=("ROOT", "CORPUS", "ROWS"))
    args = parser.parse_args()
    if args.write_corpus:  # the child that writes one corpus (see below)
        root, corpus, n = args.write_corpus
        write_corpus(root, corpus, int(n), args.shard_rows)
        return
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="bench-embed-scale-") as tmp:
        root = f"file://{tmp}/store"
        for k, n in enumerate(args.rows):
            corpus = f"c{k}-{n}"  # a size may repeat (to see the run-to-run noise)
            print(f"writing {n} rows ...", file=sys.stderr, flush=True)
            # In a child: this process must stay small. Linux starts a child's ru_maxrss
            # at the RSS of the process that spawned it (exec keeps the old address
            # space's high-water mark), so a parent that imported torch and generated
            # the corpus would set a floor under every figure below.
            subprocess.run(
                [sys.executable, __file__, "--write-corpus", root, corpus, str(n)]
                + ["--shard-rows", str(args.shard_rows)],
                cwd=ROOT,
                env=env,
                check=True,
            )
            print(f"embedding {n} rows ...", file=sys.stderr, flush=True)
            r = run_embed(root, corpus, env)
            if r["returncode"] != 0 or r["rows"] != n:
                raise SystemExit(f"embed of {n} rows failed: {r}")
            print(f"verifying {n} rows ...", file=sys.stderr, flush=True)
            v = run_verify(root, corpus, env)
            if v["returncode"] != 0 or v["rows"] != n:
                raise SystemExit(f"verify of {n} rows failed: {v}")
            r["verify"] = v
            rows_out.append((n, r))
    base = rows_out[0][1]["job_peak_rss_mib"]
    vbase = rows_out[0][1]["verify"]["peak_rss_mib"]
    lines = [
        "| corpus rows | shards | embed job peak RSS MiB | vs first | embed process peak "
        "RSS MiB | embed wall s | verify peak RSS MiB | vs first | verify wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in rows_out:
        v = r["verify"]
        lines.append(
            f"| {n:,} | {-(-n // args.shard_rows)} | {r['job_peak_rss_mib']:.1f} | "
            f"{(r['job_peak_rss_mib'] - base) / base:+.1%} | {r['peak_rss_mib']:.1f} | "
            f"{r['wall_s']:.0f} | {v['peak_rss_mib']:.1f} | "
            f"{(v['peak_rss_mib'] - vbase) / vbase:+.1%} | {v['wall_s']:.0f} |"
        )
    sizes = " ".join(str(n) for n in args.rows)
    cmd = (
        f"OMP_NUM_THREADS={args.threads} .venv/bin/python bench/embeddings_scale.py "
        f"--rows {sizes} --shard-rows {args.shard_rows}"
    )
    text = "\n".join(
        [
            f"## Embeddings at scale: peak RSS vs corpus size ({dt.date.today().isoformat()})",
            "",
            f"- Command: `{cmd}`",
            f"- Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, load average at start {load}",
            f"- Model `tiny`, generated product corpus, shards of {args.shard_rows:,} rows; "
            "each size embedded by its own `python -m embedfresh.jobs.embed` process. Job peak RSS: "
            "its own `VmHWM` when the job returns (its report's `peak_rss_mib`); process peak "
            "RSS: `os.wait4` of that process, which also counts interpreter exit; the corpus is "
            "written by another child, so the bench's own RSS sets no floor under these. Verify: "
            "`python -m embedfresh.jobs.embed_verify` on those embeddings, its own process, "
            "peak RSS from `os.wait4`",
            "",
            *lines,
            "",
            "Peak RSS so far after each shard (MiB, from the job's log):",
            "",
            *(f"- {n:,} rows: {r['shard_peaks_mib']}" for n, r in rows_out),
            "",
        ]
    )
    print(text)
    if not args.no_append:
        with Path(args.output).open("a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
