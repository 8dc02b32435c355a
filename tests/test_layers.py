"""The package floors of docs/layout.md: a package imports only from its own floor or below, and the
two drivers, `sim` and `service`, never import each other. Every import counts, including those
made inside a function."""

import ast
from pathlib import Path

import pytest

import statebudget

ROOT = Path(statebudget.__file__).parent
FLOORS = {
    "models": 0,
    "core": 1, "traces": 1,
    "solvers": 2, "planner": 2, "policies": 2,
    "sim": 3, "service": 3,
    "api": 4, "engine_adapters": 4, "gateway": 4, "cli": 4,
}
APART = {frozenset({"sim", "service"})}
MAX_LINES = 600


def _package(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.name != "__init__.py" else ""


def _imports(path: Path, root: Path):
    """(line, top-level statebudget package) of every import of the package in one file."""
    module = list(path.relative_to(root.parent).with_suffix("").parts)
    here = module[:-1]  # the package a relative import starts from (a module's, or an __init__'s own)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
                if len(target) == 1:  # `from .. import x`: x is the package imported
                    for alias in node.names:
                        yield node.lineno, alias.name
                    continue
            elif node.module and node.module.split(".")[0] == "statebudget":
                target = node.module.split(".")
            else:
                continue
            if len(target) > 1:
                yield node.lineno, target[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "statebudget" and len(parts) > 1:
                    yield node.lineno, parts[1]


def _violations(files, root: Path = ROOT) -> list[str]:
    bad = []
    for path in files:
        mine = _package(path, root)
        if not mine:
            continue
        if mine not in FLOORS:
            bad.append(f"{path.relative_to(root)}: package {mine!r} has no floor in docs/layout.md")
            continue
        for line, theirs in _imports(path, root):
            if theirs == mine or theirs == "__version__":
                continue
            if theirs not in FLOORS:
                bad.append(f"{path.relative_to(root)}:{line}: imports {theirs!r}, which has no floor")
            elif FLOORS[theirs] > FLOORS[mine]:
                bad.append(f"{path.relative_to(root)}:{line}: {mine} (L{FLOORS[mine]}) imports {theirs} "
                           f"(L{FLOORS[theirs]}), a floor above it")
            elif frozenset({mine, theirs}) in APART:
                bad.append(f"{path.relative_to(root)}:{line}: {mine} imports {theirs}: the two drivers stay apart")
    return bad


def test_no_import_climbs_a_floor_or_crosses_between_the_drivers():
    assert _violations(sorted(ROOT.rglob("*.py"))) == []


@pytest.mark.parametrize("source, package, expected", [
    ("from ..sim.engine import Simulator\n", "service", "the two drivers stay apart"),
    ("def f():\n    from ..api.app import create_app\n", "core", "a floor above it"),
    ("import statebudget.service.live\n", "policies", "a floor above it"),
    ("from .. import sim\n", "service", "the two drivers stay apart"),
])
def test_the_walk_catches_a_climbing_or_crossing_import(tmp_path, source, package, expected):
    fake_root = tmp_path / "statebudget"
    (fake_root / package).mkdir(parents=True)
    path = fake_root / package / "x.py"
    path.write_text(source)
    found = _violations([path], fake_root)
    assert len(found) == 1 and expected in found[0]


def test_no_file_in_the_package_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
