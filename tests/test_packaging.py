"""One import name: the wheel built from the repository installs ``embedfresh`` and nothing
else, and works from outside the repository.

Once per module: the tree is copied out of the repository (so no stale ``build/`` of a
developer's gets in), built into a wheel with .venv's setuptools (no download), and
installed into a clean venv (``python -m venv --without-pip``; pip from .venv installs
into it). Only then is a ``.pth`` file added that puts the dependencies on the clean
venv's path: a folder of links to .venv's site-packages without .venv's own embedfresh
(see :func:`dependencies_view`). A path line in a ``.pth`` does not run the ``.pth``
files of the folder it adds, so .venv's editable install stays off either way. Everything then runs with the clean venv's interpreter, no PYTHONPATH, from a
folder outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.airflow_home import DAG_TEST_HELPERS, airflow_home
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
#: What the build reads of a checkout.
SOURCE = ("pyproject.toml", "README.md", *sorted(set(PACKAGE_DIRS.values())))
DEV_SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def installed_name(folder: Path) -> str | None:
    """The installed package name of a repository folder, by the package-dir mapping
    (the most specific mapping wins), or None outside every mapped folder."""
    rel = folder.relative_to(ROOT)
    best = None
    for name, mapped in PACKAGE_DIRS.items():
        mapped_parts = Path(mapped).parts
        if rel.parts[: len(mapped_parts)] == mapped_parts and (
            best is None or len(mapped_parts) > len(Path(PACKAGE_DIRS[best]).parts)
        ):
            best = name
    if best is None:
        return None
    rest = rel.parts[len(Path(PACKAGE_DIRS[best]).parts) :]
    return ".".join([best, *rest])


def source_folders() -> list[Path]:
    """Every folder under the mapped package folders, __pycache__ left out."""
    out = []
    for mapped in sorted(set(PACKAGE_DIRS.values())):
        for dirpath, dirs, _files in os.walk(ROOT / mapped):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            out.append(Path(dirpath))
    return out


def test_setuptools_packages_list_every_package_folder_and_nothing_else():
    listed = PYPROJECT["tool"]["setuptools"]["packages"]
    assert len(listed) == len(set(listed)), f"packages listed twice: {listed}"
    folders = {installed_name(f): f for f in source_folders() if (f / "__init__.py").is_file()}
    missing = sorted(set(folders) - set(listed))
    extra = sorted(set(listed) - set(folders))
    assert not missing and not extra, (
        "[tool.setuptools] packages in pyproject.toml differs from the folders with an "
        f"__init__.py: add {missing} (folders {[str(folders[m]) for m in missing]}); "
        f"remove {extra}"
    )


def test_no_python_file_outside_a_package():
    """A .py file in a folder without __init__.py would be left out of the wheel."""
    stray = sorted(
        str(f.relative_to(ROOT))
        for folder in source_folders()
        if not (folder / "__init__.py").is_file()
        for f in folder.glob("*.py")
    )
    assert not stray, f"Python files in folders without __init__.py (not installed): {stray}"


@dataclass(frozen=True)
class CleanInstall:
    wheel: Path
    python: Path
    site_packages: Path
    before: frozenset[str]
    after: frozenset[str]
    work: Path  # a folder outside the repository: the cwd of every run
    env: dict[str, str]
    seconds: dict[str, float]

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
        return subprocess.run(
            [str(self.python), *args],
            cwd=self.work,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_json(self, script: str, *args: str, env: dict[str, str] | None = None):
        proc = self.run("-c", script, *args, env=env)
        output = proc.stdout[-3000:] + proc.stderr[-6000:]
        assert proc.returncode == 0, output
        return json.loads(proc.stdout.strip().splitlines()[-1]), output


def clean_env() -> dict[str, str]:
    """The environment without anything that points into the repository or .venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "EMBEDFRESH_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def dependencies_view(dest: Path) -> Path:
    """.venv's site-packages as links, less its embedfresh: neither the editable finder
    nor its ``embedfresh-*.dist-info``, whose entry point Airflow would load a second
    time (Airflow does not deduplicate distributions found on two paths)."""
    dest.mkdir()
    for entry in sorted(DEV_SITE_PACKAGES.iterdir()):
        name = entry.name
        if name.startswith(("embedfresh", "__editable__")) or name.endswith(".pth"):
            continue
        (dest / name).symlink_to(entry, target_is_directory=entry.is_dir())
    return dest


@pytest.fixture(scope="module")
def clean_install(tmp_path_factory: pytest.TempPathFactory) -> CleanInstall:
    setuptools_version = metadata.version("setuptools")
    assert int(setuptools_version.split(".")[0]) >= 68, (
        f".venv has setuptools {setuptools_version}; pyproject's build needs >= 68 "
        "(pinned in requirements-dev.txt: make venv)"
    )
    base = tmp_path_factory.mktemp("packaging")
    assert not base.resolve().is_relative_to(ROOT), f"{base} is inside the repository"
    seconds = {}

    start = time.monotonic()
    src = base / "src"
    src.mkdir()
    for name in SOURCE:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(ROOT / name, src / name)
    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    proc = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, src],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = wheels.glob("embedfresh-*.whl")
    seconds["build"] = time.monotonic() - start

    start = time.monotonic()
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    site_packages = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    before = frozenset(p.name for p in site_packages.iterdir())
    proc = subprocess.run(
        [*pip, "--python", python, "install", "--no-deps", "--no-index", wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = frozenset(p.name for p in site_packages.iterdir())
    # Only now (pip would otherwise see .venv's embedfresh as the one to replace).
    dependencies = dependencies_view(base / "dependencies")
    (site_packages / "_embedfresh_test_dependencies.pth").write_text(f"{dependencies}\n")
    seconds["venv+install"] = time.monotonic() - start

    work = base / "work"
    work.mkdir()
    env = clean_env()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return CleanInstall(wheel, python, site_packages, before, after, work, env, seconds)


def test_wheel_holds_exactly_the_source_tree(clean_install: CleanInstall):
    expected = set()
    for folder in source_folders():
        if (folder / "__init__.py").is_file():
            prefix = installed_name(folder).replace(".", "/")
            expected |= {f"{prefix}/{f.name}" for f in folder.glob("*.py")}
    names = set(zipfile.ZipFile(clean_install.wheel).namelist())
    dist_info = f"embedfresh-{VERSION}.dist-info/"
    code = {n for n in names if not n.startswith(dist_info)}
    assert code == expected, (
        f"in the wheel, not in the tree: {sorted(code - expected)}; "
        f"in the tree, not in the wheel: {sorted(expected - code)}"
    )
    entry_points = zipfile.ZipFile(clean_install.wheel).read(f"{dist_info}entry_points.txt")
    assert b"embedfresh.plugins.model_quality_plugin:ModelQualityPlugin" in entry_points


def test_install_adds_only_the_embedfresh_package(clean_install: CleanInstall):
    gained = clean_install.after - clean_install.before
    assert gained == {"embedfresh", f"embedfresh-{VERSION}.dist-info"}, (
        f"the install added {sorted(gained)} to the top of site-packages"
    )
    assert clean_install.before <= clean_install.after
    print(f"packaging fixture timings: {clean_install.seconds}")


IMPORTS = r"""
import importlib, json, os, sys
out = {"cwd": os.getcwd(), "path": sys.path, "absent": {}, "files": {}}
for name in ("jobs", "operators", "plugins", "ml", "core", "dags"):
    try:
        importlib.import_module(name)
        out["absent"][name] = "imported from " + str(getattr(sys.modules[name], "__file__", None))
    except ModuleNotFoundError as e:  # the module itself, not one it imports
        out["absent"][name] = None if e.name == name else f"found; importing it: {e!r}"
for name in ("embedfresh", "embedfresh.operators", "embedfresh.plugins.model_quality_plugin",
             "embedfresh.jobs.train", "embedfresh.core.registry"):
    try:
        out["files"][name] = importlib.import_module(name).__file__
    except ImportError as e:
        out["files"][name] = f"not importable: {e!r}"
out["editable_finder"] = [repr(f) for f in sys.meta_path if "editable" in repr(f).lower()]
plugin = sys.modules.get("embedfresh.plugins.model_quality_plugin")
out["plugin_class"] = hasattr(plugin, "ModelQualityPlugin")
print(json.dumps(out))
"""


def test_one_import_name_from_outside_the_repository(clean_install: CleanInstall):
    facts, output = clean_install.run_json(IMPORTS)
    assert Path(facts["cwd"]).resolve() == clean_install.work.resolve()
    assert not any(p and Path(p).resolve() == ROOT for p in facts["path"]), facts["path"]
    assert facts["absent"] == dict.fromkeys(facts["absent"]), (
        f"repository folder names importable as top-level modules: {facts['absent']}"
    )
    for name, file in facts["files"].items():
        assert Path(file).is_relative_to(clean_install.site_packages), (
            f"{name} imported from {file}, not from the clean install"
        )
    assert facts["editable_finder"] == [], "the editable install's finder is active"
    assert facts["plugin_class"], "the entry point's module defines no ModelQualityPlugin"


DAG_FILE = '''
"""A DAG outside the repository, on the installed package only."""
import datetime as dt

from airflow.sdk import DAG

from embedfresh.operators import (
    AcceleratorHealthOperator,
    CorpusShardsOperator,
    ResolveModelVersionOperator,
)

ROOT = {root!r}

with DAG("packaged", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False) as dag:
    resolve = ResolveModelVersionOperator(
        task_id="resolve", artifact_root=ROOT, model="tiny", version="v7"
    )
    shards = CorpusShardsOperator(
        task_id="list_shards", artifact_root=ROOT, corpus="products", shards_per_task=2
    )
    health = AcceleratorHealthOperator(
        task_id="health",
        artifact_root=ROOT,
        model="tiny",
        run_id="packaged",
        job_settings={{
            "collective_sizes": [4096],
            "collective_iters": 2,
            "memory_bytes": 1048576,
        }},
        retries=0,
    )
    resolve >> shards >> health
'''

DAG_TEST = (
    DAG_TEST_HELPERS
    + r"""
import embedfresh
run = load_dag(sys.argv[1], "packaged").test()
facts = run_facts(run, ["resolve", "list_shards", "health"])
facts["embedfresh"] = embedfresh.__file__
print(json.dumps(facts))
"""
)


def test_a_dag_outside_the_repository_runs_on_the_installed_package(
    clean_install: CleanInstall, tmp_path: Path
):
    store = tmp_path / "store"
    corpus = store / "corpora" / "products"
    corpus.mkdir(parents=True)
    for i in range(3):
        table = pa.table({"id": pa.array([2 * i, 2 * i + 1], pa.int64()), "text": ["a", "b"]})
        pq.write_table(table, corpus / f"part-{i:05d}.parquet")
    # The pinned version exists (its commit marker): resolve_version checks it at the door.
    commit = store / "models" / "tiny" / "versions" / "v7" / "COMMIT"
    commit.parent.mkdir(parents=True)
    commit.write_text('{"files": {}}')
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "packaged.py").write_text(DAG_FILE.format(root=f"file://{store}"))
    home = tmp_path / "airflow-home"
    airflow_home(home)  # a migrated SQLite database (the same Airflow as the clean venv's)
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "no-plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }

    start = time.monotonic()
    facts, output = clean_install.run_json(DAG_TEST, str(dags), env=env)
    print(f"dag.test() in the clean venv: {time.monotonic() - start:.1f} s")

    assert Path(facts["embedfresh"]).is_relative_to(clean_install.site_packages), facts
    assert facts["state"] == "success", output
    assert facts["tasks"] == [
        ["health", -1, "success"],
        ["list_shards", -1, "success"],
        ["resolve", -1, "success"],
    ], output
    assert facts["xcom"]["resolve"] == "v7"
    assert facts["xcom"]["list_shards"] == [
        {"corpus": "products", "shards": [0, 1]},
        {"corpus": "products", "shards": [2]},
    ]
    assert facts["xcom"]["health"]["verdict"] == "PASS", facts["xcom"]["health"]
    assert (store / "runs" / "tiny" / "packaged" / "reports" / "health.json").is_file()


PLUGINS = r"""
import json
from airflow import plugins_manager
info = plugins_manager.get_plugin_info()
print(json.dumps({
    "plugins": [[p["name"], str(p["source"])] for p in info],
    "import_errors": plugins_manager.get_import_errors(),
}))
"""


def airflow_env(clean_install: CleanInstall, plugins_folder: Path) -> dict[str, str]:
    home = clean_install.work / "airflow-home"
    home.mkdir(exist_ok=True)
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }


def test_airflow_lists_the_plugin_once_from_the_entry_point(
    clean_install: CleanInstall, tmp_path: Path
):
    empty = tmp_path / "plugins"
    empty.mkdir()
    proc = clean_install.run(
        "-m", "airflow", "plugins", "-o", "json", env=airflow_env(clean_install, empty)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plugins = json.loads(proc.stdout)
    assert [p["name"] for p in plugins] == ["model_quality"], plugins
    assert "embedfresh.plugins.model_quality_plugin:ModelQualityPlugin" in plugins[0]["source"]
    assert [v["name"] for v in plugins[0]["external_views"]] == ["Model quality"]

    facts, output = clean_install.run_json(PLUGINS, env=airflow_env(clean_install, empty))
    assert facts["import_errors"] == {}, output


def test_airflow_lists_the_plugin_once_with_the_repository_plugins_folder(
    clean_install: CleanInstall,
):
    facts, output = clean_install.run_json(
        PLUGINS, env=airflow_env(clean_install, ROOT / "plugins")
    )
    assert [name for name, _source in facts["plugins"]] == ["model_quality"], output
    assert "EntryPoint" in facts["plugins"][0][1], facts["plugins"]
    assert facts["import_errors"] == {}, (
        f"importing the repository's plugins folder reported errors: {facts['import_errors']}"
    )
