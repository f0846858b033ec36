"""How often the gate's interval lies: the paired bootstrap's one-sided miss rate on few
judged queries, which sets the gate's ``min_queries`` (docs/GATE.md, "How many judged
queries").

    .venv/bin/python bench/bootstrap_coverage.py --trials 1000

Draws per-query nDCG@10 pairs shaped like two refreshes of a search model (most queries
unchanged, the rest moved by a heavy-tailed amount, a small true improvement), runs the
product's own ``paired_bootstrap`` at 95% on ``n`` queries, and counts how often the
interval's lower bound lies above the true relative difference: a 95% interval should do
so 2.5% of the time, and a PASS rests on that bound. Prints one line per ``n``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from embedfresh.ml.gate.stats import paired_bootstrap  # noqa: E402


def draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(candidate, reference) nDCG@10 of ``n`` queries: 60% unchanged, the rest moved by
    a Student-t (3 degrees of freedom) step of scale 0.05 around +0.002."""
    ref = rng.beta(4, 2, n)
    moved = rng.random(n) >= 0.6
    step = rng.standard_t(3, n) * 0.05 + 0.002
    return np.clip(ref + np.where(moved, step, 0.0), 0.0, 1.0), ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sizes", default="10,30,100,300,1000")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cand, ref = draw(rng, 2_000_000)
    truth = (cand.mean() - ref.mean()) / ref.mean()
    print(f"true relative difference d = {truth:+.4%}")
    for n in (int(s) for s in args.sizes.split(",")):
        above = 0
        for trial in range(args.trials):
            c, r = draw(rng, n)
            boot = paired_bootstrap(
                "ndcg_at_10", {"ndcg_at_10": c}, {"ndcg_at_10": r}, 1000, 0.95, trial
            )
            above += boot.ci_low > truth
        print(f"{n:>6} queries: lower bound above the truth in {above / args.trials:.1%} "
              f"of {args.trials} trials (a 95% interval: 2.5%)")  # fmt: skip


if __name__ == "__main__":
    main()
