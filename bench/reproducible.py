"""Killed-and-resumed runs against clean ones, on a backend (the GPU items of the
performance work: "killed-and-clean embed parts byte-equal, train resume bit-exact on
CUDA")::

    .venv/bin/python bench/reproducible.py --backend cuda --checks embed,train,embed-compiled

Two checks, each through the real jobs in processes of their own, as a team runs them:

1. **embed**: a team's own BERT model (``tests/own_model.build_own_model``: its own
   tokenizer, 8 scripts, ``max_seq_length`` 384), published with ``publish_model``;
   1,200 texts of 1-40 sentences with string ids ``acme-000123-1a2b`` in 4 shards of
   300. ``embed`` is SIGKILLed (its process group) right after ``part-00000.COMMIT``
   appears, then re-run plainly; a clean run embeds the same corpus in a second root.
   Every part of the two roots must be byte-equal (``embed-compiled``: both runs with
   the compiled forward, ``compile=true``).
2. **train**: the train job (tiny model, 64 steps, a checkpoint every 7) run through,
   and in a second root SIGKILLed after step ``--kill-at`` and restarted with the same
   run id. The published weights' sha256 must be equal.

Prints one JSON line per check and a Markdown table; exits 1 when a check differs.
On the CPU it is the same as the reliability tests; its point is another backend.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARDS, ROWS = 4, 300
TRAIN = ("data_interval_start=2026-01-01", "epochs=2", "checkpoint_every=7", "log_every=1")


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def job(name: str, *sets: str) -> list[str]:
    cmd = [sys.executable, "-m", f"embedfresh.jobs.{name}"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run(name: str, *sets: str) -> dict:
    done = subprocess.run(job(name, *sets), cwd=ROOT, env=env(), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name} exited {done.returncode}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def own_corpus(root: str, model_dir: Path) -> None:
    """The team's corpus: 1,200 texts of 1-40 sentences mixing 8 scripts, string ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedfresh.core import layout
    from embedfresh.core.storage import ArtifactStore
    from tests.own_model import CORPUS

    rng = random.Random(7)
    store = ArtifactStore(root)
    for shard in range(SHARDS):
        texts = [" ".join(rng.choices(CORPUS, k=rng.randint(1, 40))) for _ in range(ROWS)]
        ids = [f"acme-{shard * ROWS + i:06d}-{rng.getrandbits(16):04x}" for i in range(ROWS)]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": ids, "text": texts}), sink)
        store.write_bytes(
            f"{layout.corpus('catalogue')}/{layout.part_name(shard)}", sink.getvalue().to_pybytes()
        )


def parts(root: str) -> dict[str, str]:
    out = Path(root.removeprefix("file://")) / "embeddings/acme/v0/catalogue"
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.parquet"))
    }


def embed_check(tmp: Path, backend: str, compile_: bool) -> dict:
    from tests.own_model import build_own_model

    model_dir = build_own_model(tmp / "acme-st", "bert")  # one build: the same weights twice
    roots = {name: f"file://{tmp / name}" for name in ("killed", "clean")}
    sets = ["model=acme", "version=v0", "corpus=catalogue", f"backend={backend}"]
    if compile_:
        sets.append("compile=true")
    for root in roots.values():
        own_corpus(root, model_dir)
        run("publish_model", f"artifact_root={root}", "model=acme", f"source={model_dir}",
            "version=v0")  # fmt: skip
    killed = roots["killed"]
    commit = Path(killed.removeprefix("file://")) / "embeddings/acme/v0/catalogue/part-00000.COMMIT"
    started = time.perf_counter()
    proc = subprocess.Popen(
        job("embed", f"artifact_root={killed}", "run_id=k", *sets),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    while not commit.exists() and proc.poll() is None:
        time.sleep(0.02)
    killed_at = time.perf_counter() - started
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    rerun = run("embed", f"artifact_root={killed}", "run_id=k", *sets)
    clean = run("embed", f"artifact_root={roots['clean']}", "run_id=c", *sets)
    a, b = parts(killed), parts(roots["clean"])
    return {
        "check": "embed killed-and-rerun vs clean" + (" (compile=true)" if compile_ else ""),
        "killed_after_s": round(killed_at, 1),
        "killed_exit": proc.returncode,
        "rerun_rows": rerun["rows"],
        "rerun_reused": rerun["rows_reused"],
        "clean_rows": clean["rows"],
        "parts": len(a),
        "byte_equal": sum(a[k] == b.get(k) for k in a),
        "ok": len(a) == SHARDS and a == b,
    }


_STEP = re.compile(r" step (\d+)/(\d+) ")


def weights(root: str, version: str) -> str:
    path = Path(root.removeprefix("file://")) / "models/tiny/versions" / version
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def train_check(tmp: Path, backend: str, kill_at: int) -> dict:
    from _common import generate_data
    from train_throughput import DAY

    roots = {name: f"file://{tmp / name}" for name in ("through", "resumed")}
    for root in roots.values():
        generate_data(root, DAY, 1024)
    sets = [f"backend={backend}", "run_id=r", "init=base", *TRAIN]
    run("train", f"artifact_root={roots['through']}", *sets)
    proc = subprocess.Popen(
        job("train", f"artifact_root={roots['resumed']}", *sets),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    last = 0
    for line in iter(proc.stderr.readline, ""):
        if m := _STEP.search(line):
            last = int(m.group(1))
            if last >= kill_at:
                os.killpg(proc.pid, signal.SIGKILL)
                break
    proc.wait()
    resumed = run("train", f"artifact_root={roots['resumed']}", *sets)
    a, b = (
        weights(roots["through"], resumed["version"]),
        weights(roots["resumed"], resumed["version"]),
    )
    return {
        "check": "train killed-and-resumed vs uninterrupted",
        "killed_after_step": last,
        "resumed_from": (resumed.get("resumed_from") or {}).get("step"),
        "sha256_through": a[:16],
        "sha256_resumed": b[:16],
        "ok": a == b,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument(
        "--checks", default="embed,train", help="embed, train, embed-compiled (compile=true)"
    )
    parser.add_argument("--kill-at", type=int, default=20)
    args = parser.parse_args()
    checks = set(args.checks.split(","))
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as tmp:
        if "embed" in checks:
            results.append(embed_check(Path(tmp) / "embed", args.backend, False))
            print(json.dumps(results[-1]), flush=True)
        if "train" in checks:
            results.append(train_check(Path(tmp) / "train", args.backend, args.kill_at))
            print(json.dumps(results[-1]), flush=True)
        if "embed-compiled" in checks:  # last: its cold compiles take longest
            results.append(embed_check(Path(tmp) / "embed-compiled", args.backend, True))
            print(json.dumps(results[-1]), flush=True)
    print("\n| check | backend | result | details |\n|---|---|---|---|")
    for r in results:
        details = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("check", "ok"))
        print(
            f"| {r['check']} | {args.backend} | {'equal' if r['ok'] else 'DIFFERENT'} | {details} |"
        )
    raise SystemExit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
