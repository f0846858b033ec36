"""The embedded demo: the whole pipeline on CPU with a local artifact folder.

Generates the data set, then for two consecutive days runs the jobs exactly as the
local runner does (one ``python -m jobs.<name>`` process each): train -> evaluate ->
gate -> promote. The second day trains incrementally from the model the first day
promoted. Ends with a short summary. Run it with ``make demo``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


GATE_REFUSED = 3


def job(name: str, root: str, *sets: str) -> dict | None:
    """Run one job as its own process; None when the quality gate refused (exit 3)."""
    cmd = [sys.executable, "-m", f"jobs.{name}", "--set", f"artifact_root={root}"]
    for s in sets:
        cmd += ["--set", s]
    print(f"\n$ python -m jobs.{name} " + " ".join(f"--set {s}" for s in sets), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode == GATE_REFUSED and name == "gate":
        return None
    if proc.returncode != 0:
        sys.exit(f"demo: jobs.{name} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--root",
        default=str(ROOT / "artifacts" / "demo"),
        help="local folder of the demo's artifact store (emptied first)",
    )
    parser.add_argument("--start", default="2026-01-01")
    parser.add_argument("--train-rows", type=int, default=4000)
    parser.add_argument("--eval-rows", type=int, default=10000)
    parser.add_argument("--corpus-rows", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(args.root).resolve()
    if folder.exists():
        print(f"demo: emptying the demo store {folder}")
        shutil.rmtree(folder)
    root = f"file://{folder}"
    start = dt.date.fromisoformat(args.start)

    from jobs.data.generate import write_dataset
    from jobs.storage import ArtifactStore

    summary = write_dataset(
        ArtifactStore(root),
        "products",
        0,
        start,
        2,
        args.train_rows,
        args.eval_rows,
        "products",
        args.corpus_rows,
        1000,
    )
    print(
        f"demo: generated {summary['train_rows']} training rows over 2 days, "
        f"{args.eval_rows} eval rows, a corpus of {args.corpus_rows} products"
    )

    results = []
    for offset in range(2):
        day = start + dt.timedelta(days=offset)
        run = f"demo-{day.isoformat()}"
        common = (f"run_id={run}", "model=tiny", "backend=cpu")
        trained = job("train", root, *common, f"data_interval_start={day}", f"epochs={args.epochs}")
        evaluated = job("evaluate", root, *common)
        gated = job("gate", root, *common)
        if gated is None:  # refused: the decision and its reasons are in gate.json
            report = ArtifactStore(root).read_json(f"runs/tiny/{run}/reports/gate.json")
            gated = {
                "verdict": report["verdict"],
                "reference": report["reference"]["version"],
                "n_needed": report.get("n_needed"),
            }
        promoted = job("promote", root, *common) if gated["verdict"] == "PASS" else None
        results.append((day, trained, evaluated, gated, promoted))

    print("\n=== embedded demo: summary ===")
    for day, trained, evaluated, gated, promoted in results:
        init = trained["init"]
        start_from = init.get("version") if init["source"] == "production" else init["weights"]
        m = evaluated["metrics"]
        print(
            f"{day}: trained {trained['steps']} steps from {init['source']} ({start_from}), "
            f"{trained['samples_per_second']} samples/s\n"
            f"    eval: accuracy {m['accuracy']:.4f}  auc {m['auc']:.4f}  "
            f"log_loss {m['log_loss']:.4f}  recall@10 {m['recall_at_10']:.4f}\n"
            + (
                f"    gate: {gated['verdict']} vs {gated['reference']}  ->  production is now "
                f"{promoted['production']}"
                if promoted
                else f"    gate: {gated['verdict']} vs {gated['reference']} (an eval set of about "
                f"{gated['n_needed']} examples would decide)  ->  production unchanged"
            )
        )
    last = results[-1]
    print(f"model:    {last[1]['version_url']}")
    print(f"reports:  {last[1]['report'].rsplit('/', 1)[0]}/")
    registry = ArtifactStore(root).url("models/tiny/registry.json")
    print(f"registry: {registry}")


if __name__ == "__main__":
    main()
