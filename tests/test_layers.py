"""The dependency rule is enforced: import-linter keeps the layer and independence contracts on
this checkout, and breaks them when a peer imports another peer or the base imports an app."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "lint-imports"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "LINT_IMPORTS": str(LINT_IMPORTS)}
    return subprocess.run([str(SCRIPT), str(root)], capture_output=True, text=True, env=env)


def _copy(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    for name in ("embodied", "sims", "policies", "rewards", "datasets"):
        shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", checkout / ".importlinter")
    return checkout


def test_this_checkout_keeps_both_contracts() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "bad_import", "broken"),
    [
        ("sims/scene.py", "import embodied.rewards.metrics", "never import each other BROKEN"),
        ("embodied/core/io.py", "import embodied.apps.cli", "Layers: apps > train"),
        ("embodied/rollout/episodes.py", "import embodied.train.loop", "Layers: apps > train"),
    ],
)
def test_a_wrong_import_breaks_a_contract(
    tmp_path: Path, module: str, bad_import: str, broken: str
) -> None:
    checkout = _copy(tmp_path)
    path = checkout / module
    path.write_text(path.read_text() + f"\n{bad_import}  # deliberately wrong\n")
    result = _lint(checkout)
    assert result.returncode != 0
    assert broken in result.stdout and "BROKEN" in result.stdout, result.stdout


def test_pyproject_lists_every_package_so_a_wheel_is_complete() -> None:
    """setuptools' explicit package list (needed beside package-dir) must name every folder
    with an ``__init__.py``, or an installed toolkit lacks it."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = {"embodied": "embodied", **config["package-dir"]}
    found = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *parts]))
    assert found == set(config["packages"])
