"""The import arrows of docs/architecture.md, enforced: every ``import`` of hpcadj inside hpcadj/
(function-local ones included) must run along an arrow of the fenced ``arrows`` block there, or
down a chain of them; the arrows form no cycle, and none is listed that no import uses.

A module belongs to the unit of the longest dotted name in the block that prefixes it
(``hpcadj.checkpoint.storage.pfs`` to ``checkpoint.storage``, ``hpcadj.checkpoint.provision`` to
``checkpoint``); ``hpcadj`` itself is the package's ``__init__``. Imports inside one unit are free.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpcadj"
DOC = ROOT / "docs" / "architecture.md"


def documented_arrows(text: str) -> dict[str, set[str]]:
    """The ``unit -> unit, unit`` lines of the doc's fenced block tagged ``arrows``."""
    block = re.search(r"^```arrows\n(.*?)^```", text, re.S | re.M)
    assert block, f"{DOC} has no ```arrows block"
    arrows: dict[str, set[str]] = {}
    for line in block.group(1).splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        source, _, targets = line.partition("->")
        names = {t.strip() for t in targets.split(",") if t.strip()}
        arrows.setdefault(source.strip(), set()).update(names)
        for name in names:
            arrows.setdefault(name, set())
    return arrows


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_modules(path: Path, module: str | None = None):
    """(line, hpcadj module) for every import in ``path`` (the module ``module``, by default its
    place in the tree), at any depth, relative ones resolved."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # ``from . import kernels`` imports a module
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if is_module(sub) else target


def unit_of(module: str, units) -> str | None:
    """The unit ``module`` (``hpcadj.x.y``) belongs to: the longest unit name prefixing it."""
    if module == "hpcadj":
        return "hpcadj"
    if not module.startswith("hpcadj."):
        return None
    name = module[len("hpcadj."):]
    best = None
    for unit in units:
        if (name == unit or name.startswith(unit + ".")) and (best is None or len(unit) > len(best)):
            best = unit
    return best


def reachable(arrows: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(arrows.get(start, ()))
    while todo:
        unit = todo.pop()
        if unit not in seen:
            seen.add(unit)
            todo.extend(arrows.get(unit, ()))
    return seen


ARROWS = documented_arrows(DOC.read_text())


def edges() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> where ("path:line"), over every module of hpcadj/."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path), ARROWS)
        assert source is not None, f"{path.relative_to(ROOT)} is in no unit of the arrows block"
        for line, target in imported_modules(path):
            unit = unit_of(target, ARROWS)
            if target.startswith("hpcadj") and unit is None:
                pytest.fail(f"{path.relative_to(ROOT)}:{line} imports {target}, in no unit of the arrows block")
            if unit is not None and unit != source:
                found.setdefault((source, unit), []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def test_no_import_runs_up():
    upward = [f"{where[0]}: {a} -> {b} ({len(where)} place(s)), not an arrow of docs/architecture.md"
              for (a, b), where in sorted(edges().items()) if b not in reachable(ARROWS, a)]
    assert not upward, "\n".join(upward)


def test_arrows_form_layers():
    cycles = sorted(unit for unit in ARROWS if unit in reachable(ARROWS, unit))
    assert not cycles, f"the arrows of docs/architecture.md go round through {cycles}"


def test_every_arrow_is_used():
    used = set(edges())
    stale = sorted(f"{a} -> {b}" for a, targets in ARROWS.items() for b in targets if (a, b) not in used)
    assert not stale, f"docs/architecture.md lists arrows no import uses: {stale}"


def test_the_walk_sees_a_function_local_upward_import(tmp_path):
    """The rule can fail: a local import inside a function of a lower unit is found and placed."""
    module = tmp_path / "probe.py"
    module.write_text("def f():\n    from hpcadj.adjoint.driver import Driver\n    return Driver\n")
    found = [target for _, target in imported_modules(module, "hpcadj.telemetry.probe")]
    assert [unit_of(t, ARROWS) for t in found] == ["adjoint"]
    assert "adjoint" not in reachable(ARROWS, "telemetry")
