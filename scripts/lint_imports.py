"""Check the import contracts (``[tool.importlinter]`` in pyproject.toml) with import-linter.

import-linter's graph builder (grimp) finds a package through ``importlib`` and then
walks that one folder, so on the repository it would see ``embedfresh/`` alone: the
control plane lives at the root (``operators/``, ``plugins/``) and only becomes
``embedfresh.operators`` / ``embedfresh.plugins`` through setuptools' package-dir
mapping. This script lays the tree out as it installs: a temporary folder whose
``embedfresh/`` links to the real files and folders, with every mapped package linked in
at its installed place, read from ``[tool.setuptools.package-dir]``. ``lint-imports``
then runs there (its working folder comes first on ``sys.path``, ahead of the editable
install) with the repository's config.

Usage (``make lint`` runs it)::

    python scripts/lint_imports.py [--root REPO] [--contract ID]... [--show-timings] [--verbose]

``--root`` picks another checkout (tests/test_import_contracts.py plants violations in
a copy); the other options are lint-imports' own. Exit status: lint-imports' (0: kept).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(root: Path) -> dict[str, Path]:
    """Installed package name -> folder in ``root``, from pyproject's package-dir mapping."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    mapping = config.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if not mapping:
        raise SystemExit(f"{root / 'pyproject.toml'}: no [tool.setuptools.package-dir] table")
    dirs = {name: (root / folder).resolve() for name, folder in mapping.items()}
    for name, folder in dirs.items():
        if not (folder / "__init__.py").is_file():
            raise SystemExit(f"package-dir maps {name!r} to {folder}, which has no __init__.py")
    return dirs


def build_view(root: Path, dest: Path) -> None:
    """Lay out ``root``'s packages under ``dest`` as they install, as symbolic links.

    A package with another mapped package inside it becomes a real folder whose entries
    link to the package's own; any other package is one link to its folder.
    """
    dirs = package_dirs(root)
    for name in sorted(dirs, key=lambda n: n.count(".")):
        place = dest.joinpath(*name.split("."))
        nested = [n for n in dirs if n.startswith(name + ".")]
        if not nested:
            place.symlink_to(dirs[name], target_is_directory=True)
            continue
        place.mkdir(parents=True)
        taken = {n.split(".")[name.count(".") + 1] for n in nested}
        for entry in sorted(dirs[name].iterdir()):
            if entry.name in taken:
                raise SystemExit(f"{entry} is in the way of the mapped package {name}.{entry.name}")
            (place / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())


@contextmanager
def installed_view(root: Path = ROOT) -> Iterator[Path]:
    """A temporary folder holding ``root``'s packages laid out as installed."""
    with tempfile.TemporaryDirectory(prefix="embedfresh-import-view-") as tmp:
        build_view(root, Path(tmp))
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to check")
    parser.add_argument("--contract", action="append", default=[], help="only this contract id")
    parser.add_argument("--show-timings", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    # Imported here so that `installed_view` works without import-linter installed.
    from importlinter.cli import lint_imports

    with installed_view(root) as view:
        os.chdir(view)  # lint-imports puts its working folder first on sys.path
        return lint_imports(
            config_filename=str(root / "pyproject.toml"),
            limit_to_contracts=tuple(args.contract),
            no_cache=True,
            no_logo=True,
            show_timings=args.show_timings,
            verbose=args.verbose,
        )


if __name__ == "__main__":
    sys.exit(main())
