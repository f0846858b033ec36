"""Re-resolve the pinned requirements from requirements.in and requirements-dev.in.

Installs both into a throw-away virtualenv, then splits ``pip freeze`` into the
runtime closure of requirements.in (requirements.txt) and the rest
(requirements-dev.txt). Run with ``make lock``; review the diff before committing.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLOSURE = r"""
import re, sys
from importlib import metadata
from packaging.requirements import Requirement
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
roots = [Requirement(l) for l in open(sys.argv[1]).read().splitlines()
         if l.strip() and not l.startswith("#")]
stack = [(r, frozenset(r.extras)) for r in roots if r.marker is None or r.marker.evaluate()]
seen = set()
while stack:
    req, extras = stack.pop()
    if (norm(req.name), extras) in seen:
        continue
    seen.add((norm(req.name), extras))
    try:
        dist = metadata.distribution(req.name)
    except metadata.PackageNotFoundError:
        continue
    for spec in dist.requires or []:
        r = Requirement(spec)
        envs = [{"extra": e} for e in (extras or {""})]
        if r.marker is None or any(r.marker.evaluate(env) for env in envs):
            stack.append((r, frozenset(r.extras)))
print("\n".join(sorted({name for name, _ in seen})))
"""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        subprocess.run(
            [
                *pip,
                "install",
                "-q",
                "-r",
                ROOT / "requirements.in",
                "-r",
                ROOT / "requirements-dev.in",
            ],
            check=True,
        )
        frozen = subprocess.run(
            [*pip, "freeze", "--exclude-editable"], check=True, capture_output=True, text=True
        ).stdout.splitlines()
        runtime = set(
            subprocess.run(
                [str(venv / "bin" / "python"), "-c", CLOSURE, ROOT / "requirements.in"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
        )
    run, dev = [], []
    for line in (ln for ln in frozen if "==" in ln):
        name = norm(line.split("==")[0])
        if name.startswith("nvidia-") or name == "triton":
            line += ' ; platform_system == "Linux" and platform_machine == "x86_64"'
        if name == "torch-xla":
            line += ' ; platform_machine == "x86_64"'
        (run if name in runtime else dev).append(line)
    header = (
        "# Pinned runtime dependencies: the full closure of requirements.in, resolved on\n"
        "# Python 3.11 / Linux x86_64 (torch 2.9.1 is PyPI's CUDA build; it runs on CPU).\n"
        "# Regenerate with: make lock\n"
    )
    (ROOT / "requirements.txt").write_text(header + "\n".join(run) + "\n")
    (ROOT / "requirements-dev.txt").write_text(
        "# Test and lint tools, pinned; the runtime pins come from requirements.txt.\n"
        "-r requirements.txt\n" + "\n".join(dev) + "\n"
    )
    print(f"{len(run)} runtime pins, {len(dev)} dev pins")


if __name__ == "__main__":
    main()
