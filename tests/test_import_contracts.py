"""The rooms' doors hold: import-linter's contracts (pyproject.toml) pass on the real tree
and fail, naming the contract and the import, when one violation of each is planted in a
copy; the package has no import cycle; the DAG files import only operators and core.

lint-imports runs through scripts/lint_imports.py (as ``make lint`` does), which lays the
checkout out as it installs (``operators/`` as ``embedfresh/operators``) in a temporary
folder and runs there, so that the copy, not the editable install, is what grimp reads.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT_IMPORTS = ROOT / "scripts" / "lint_imports.py"
#: What lint-imports reads of a checkout.
TREE = ("embedfresh", "operators", "plugins", "pyproject.toml")
CONTRACTS = {
    c["id"]: c["name"]
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}


def lint_imports(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(LINT_IMPORTS), "--root", str(root), *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_tree(dest: Path) -> Path:
    dest.mkdir()
    for name in TREE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def first_module(root: Path, folder: str, *, avoid: tuple[str, ...] = ()) -> tuple[Path, str]:
    """The first ``*.py`` (not ``__init__``) in ``root/folder``, and its installed name."""
    files = sorted(
        p for p in (root / folder).glob("*.py") if p.stem != "__init__" and p.stem not in avoid
    )
    assert files, f"no module in {root / folder} to plant a violation in"
    package = {"operators": "embedfresh.operators", "plugins": "embedfresh.plugins"}.get(
        folder.split("/")[0], folder.split("/")[0]
    )
    parts = [package, *folder.split("/")[1:], files[0].stem]
    return files[0], ".".join(parts)


@dataclass(frozen=True)
class Plant:
    contract: str
    folder: str  # where the importing module is, as in the repository
    code: str  # appended to that module
    imported: str  # what the chain that lint-imports reports ends in
    avoid: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.contract}:{self.folder}"


LAZY = "\n\ndef _planted_violation():\n    {}  # planted by tests/test_import_contracts.py\n"
TOP = "\n{}  # planted by tests/test_import_contracts.py\n"

PLANTS = [
    Plant(
        "data-plane-layers",
        "embedfresh/core",
        LAZY.format("from embedfresh.ml import checkpoint"),
        "embedfresh.ml.checkpoint",
    ),
    Plant(
        "data-plane-layers",
        "embedfresh/ml",
        LAZY.format("from embedfresh.jobs import train"),
        "embedfresh.jobs.train",
    ),
    Plant(
        "control-plane-imports-core-only",
        "operators",
        LAZY.format("from embedfresh.ml.model import versions"),
        "embedfresh.ml.model.versions",
    ),
    Plant(
        "control-plane-imports-core-only",
        "plugins/model_quality",
        TOP.format("import embedfresh.jobs.train"),
        "embedfresh.jobs.train",
    ),
    Plant(
        "control-plane-rooms-independent",
        "plugins/model_quality",
        LAZY.format("from embedfresh.operators import constants"),
        "embedfresh.operators.constants",
    ),
    Plant(
        "control-plane-no-ml-libraries",
        "operators",
        LAZY.format("import torch"),
        "torch",
    ),
    Plant(
        "control-plane-no-database-client",
        "plugins/model_quality",
        LAZY.format("import psycopg"),
        "psycopg",
    ),
    Plant("core-torch-free", "embedfresh/core", TOP.format("import torch"), "torch"),
    Plant("core-torch-free", "embedfresh/core", LAZY.format("import boto3"), "boto3"),
    Plant(
        "data-plane-no-airflow",
        "embedfresh/jobs",
        LAZY.format("from airflow.sdk import DAG"),
        "airflow",
    ),
    Plant(
        "data-plane-no-control-plane",
        "embedfresh/ml",
        LAZY.format("from embedfresh.operators import constants"),
        "embedfresh.operators.constants",
    ),
    Plant(
        "jobs-independent",
        "embedfresh/jobs",
        LAZY.format("from embedfresh.jobs import evaluate"),
        "embedfresh.jobs.evaluate",
        avoid=("evaluate",),
    ),
]


def test_every_contract_has_a_planted_violation():
    planted = {p.contract for p in PLANTS}
    assert planted == set(CONTRACTS), (
        f"contracts without a planted violation here: {sorted(set(CONTRACTS) - planted)}; "
        f"planted for contracts that pyproject.toml lacks: {sorted(planted - set(CONTRACTS))}"
    )


def test_real_tree_keeps_every_contract():
    proc = lint_imports(ROOT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"lint-imports failed on the repository:\n{output}"
    for name in CONTRACTS.values():
        assert f"{name} KEPT" in output, f"contract {name!r} not reported KEPT:\n{output}"


@pytest.mark.parametrize("plant", PLANTS, ids=str)
def test_planted_violation_breaks_its_contract(plant: Plant, tmp_path: Path):
    copy = copy_tree(tmp_path / "tree")
    module_file, module = first_module(copy, plant.folder, avoid=plant.avoid)
    module_file.write_text(module_file.read_text() + plant.code)

    proc = lint_imports(copy, "--contract", plant.contract)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, (
        f"lint-imports kept {plant.contract} with {plant.code!r} in {module}:\n{output}"
    )
    assert f"{CONTRACTS[plant.contract]} BROKEN" in output, output
    chain = f"{module} -> {plant.imported}"
    assert chain in output, f"lint-imports did not name the planted import {chain}:\n{output}"


#: Runs in the laid-out folder: prints the import cycles of ``embedfresh`` as JSON, each
#: as [module, imported, ..., module] with the line numbers of each import.
FIND_CYCLES = r"""
import json, sys
import grimp

graph = grimp.build_graph("embedfresh", cache_dir=None)
assert "embedfresh.operators" in graph.modules, "the graph lacks embedfresh.operators"
index, low, stack, on_stack, components = {}, {}, [], set(), []


def strongconnect(root):
    # Tarjan's algorithm, iterative.
    work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
        module, imports = work[-1]
        for imported in imports:
            if imported not in index:
                index[imported] = low[imported] = len(index)
                stack.append(imported)
                on_stack.add(imported)
                work.append((imported, iter(sorted(graph.find_modules_directly_imported_by(imported)))))
                break
            if imported in on_stack:
                low[module] = min(low[module], index[imported])
        else:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1 or module in graph.find_modules_directly_imported_by(module):
                    components.append(sorted(component))


for module in sorted(graph.modules):
    if module not in index:
        strongconnect(module)

cycles = []
for component in components:
    start = component[0]
    # The shortest way back to start through one of its imports inside the component.
    back = min(
        (
            [start] + (list(graph.find_shortest_chain(importer=nxt, imported=start)) if nxt != start else [start])
            for nxt in graph.find_modules_directly_imported_by(start)
            if nxt in component
        ),
        key=len,
    )
    steps = []
    for importer, imported in zip(back, back[1:]):
        lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
        steps.append(f"{importer} -> {imported} (l.{','.join(map(str, lines))})")
    cycles.append({"modules": component, "cycle": steps})
print(json.dumps(cycles))
"""


def import_cycles(root: Path) -> list[dict]:
    spec = importlib.util.spec_from_file_location("lint_imports_script", LINT_IMPORTS)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with script.installed_view(root) as view:
        # A fresh interpreter in the view: here `embedfresh` is imported already, and
        # grimp would find it (the editable install, without operators/) through sys.modules.
        proc = subprocess.run(
            [sys.executable, "-c", FIND_CYCLES],
            cwd=view,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def describe(cycles: list[dict]) -> str:
    return "\n".join(f"- {len(c['modules'])} modules: " + "; ".join(c["cycle"]) for c in cycles)


def test_no_import_cycles():
    cycles = import_cycles(ROOT)
    assert not cycles, "import cycles in embedfresh (lazy imports count):\n" + describe(cycles)


def test_a_planted_cycle_is_found(tmp_path: Path):
    copy = copy_tree(tmp_path / "tree")
    (copy / "embedfresh" / "core" / "planted_a.py").write_text(
        "from embedfresh.core import planted_b\n"
    )
    (copy / "embedfresh" / "core" / "planted_b.py").write_text(
        "def f():\n    from embedfresh.core import planted_a\n"
    )
    cycles = import_cycles(copy)
    planted = [c for c in cycles if "embedfresh.core.planted_a" in c["modules"]]
    assert planted, "the planted cycle was not found:\n" + describe(cycles)
    assert planted[0]["modules"] == ["embedfresh.core.planted_a", "embedfresh.core.planted_b"]
    assert planted[0]["cycle"] == [
        "embedfresh.core.planted_a -> embedfresh.core.planted_b (l.1)",
        "embedfresh.core.planted_b -> embedfresh.core.planted_a (l.2)",
    ]


# The DAG files are no package (import-linter cannot see them): checked here.
DAG_ALLOWED = ("embedfresh.operators", "embedfresh.core")
#: Never imported by a DAG file, at module level or in a function.
DAG_FORBIDDEN = ("torch", "torch_xla", "transformers", "sentence_transformers", "boto3")
#: The repository's folders: not importable once installed (one import name).
NOT_INSTALLED = ("operators", "plugins", "jobs", "ml", "core", "dags")


def dag_import_violations(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(f"{filename}:{node.lineno}: relative import (a DAG is no package)")
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "embedfresh" and not any(
                name == room or name.startswith(room + ".") for room in DAG_ALLOWED
            ):
                found.append(f"{filename}:{node.lineno}: imports {name} (only {DAG_ALLOWED})")
            elif top in DAG_FORBIDDEN:
                found.append(f"{filename}:{node.lineno}: imports {name}")
            elif top in NOT_INSTALLED:
                found.append(f"{filename}:{node.lineno}: imports {name} (use embedfresh.{name})")
    return found


def test_dag_files_import_only_operators_and_core():
    files = sorted((ROOT / "dags").glob("*.py"))
    assert files, "no DAG files found in dags/"
    violations = [v for f in files for v in dag_import_violations(f.read_text(), f.name)]
    assert not violations, "DAG files step out of the control plane:\n" + "\n".join(violations)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from embedfresh.operators import X\nimport embedfresh.core.settings\n", []),
        ("from embedfresh.ml.model import versions\n", ["d.py:1: imports embedfresh.ml.model"]),
        ("import embedfresh.jobs.train\n", ["d.py:1: imports embedfresh.jobs.train"]),
        ("def f():\n    import torch\n", ["d.py:2: imports torch"]),
        ("from operators import X\n", ["d.py:1: imports operators (use embedfresh.operators)"]),
        ("from . import x\n", ["d.py:1: relative import"]),
    ],
)
def test_dag_import_check_bites(source: str, expected: list[str]):
    found = dag_import_violations(textwrap.dedent(source), "d.py")
    assert len(found) == len(expected), found
    for line, prefix in zip(found, expected, strict=True):
        assert line.startswith(prefix), (line, prefix)


#: A private torch op (``torch.ops.<namespace>._name``) or anything under ``torch._C``:
#: neither is a public API, and each can break on the next torch (issue 38).
PRIVATE_TORCH = re.compile(r"torch\.ops\.\w+\._\w+|torch\._C\b")


def private_torch_calls(source: str) -> list[str]:
    """Private torch ops and ``torch._C`` names used by the code in ``source`` (names in
    comments and docstrings are not calls: the AST's attribute chains are read)."""
    tree = ast.parse(source)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    chains = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and id(n) not in inner
    ]
    return sorted({chain for chain in chains if PRIVATE_TORCH.match(chain)})


def test_the_product_calls_no_private_torch_op():
    product = [
        path
        for folder in ("embedfresh", "operators", "plugins", "dags")
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]
    calls = {
        str(p.relative_to(ROOT)): found
        for p in product
        if (found := private_torch_calls(p.read_text()))
    }
    assert calls == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "torch.ops.mkldnn._linear_pointwise(x, w, b, 'none', [], '')",
            ["torch.ops.mkldnn._linear_pointwise"],
        ),
        ("ok = torch._C._cpu._is_amx_tile_supported()", ["torch._C._cpu._is_amx_tile_supported"]),
        ("torch.ops.aten.gelu_(x)  # torch._C in a comment", []),
        ('"""torch.ops.mkldnn._reorder_linear_weight in a docstring"""', []),
    ],
)
def test_private_torch_check_bites(source: str, expected: list[str]):
    assert private_torch_calls(source) == expected
