"""docs/api.md's signatures are the code's: every documented call of the public API names the
parameters the code has, in its order, keyword-only where the code's are, with the code's defaults;
and the result fields it lists for the verification tests exist."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

import hpcadj

from ..helpers import ROOT

PAGE = (ROOT / "docs" / "api.md").read_text()
#: the calls whose every parameter api.md must document
DOCUMENTED = ["Checkpointing", "Restart", "GradientSession", "measure_costs", "taylor_test",
              "dot_product_test", "check_contract", "Grid"]



def documented_signature(name: str) -> list[str]:
    """The parameters of the documented ``name(...)`` signature: of the backticked calls of ``name``
    whose parameters are all bare names or name=literal (not an example's ``Checkpointing(costs=...)``),
    the longest."""
    text = " ".join(PAGE.split())
    found = [_split(m.group(1)) for m in re.finditer(rf"`{name}\(([^`]*?)\)(?:\s*->\s*\w+)?`", text)]
    signatures = [params for params in found if params and all(_is_parameter(p) for p in params)]
    assert signatures, f"docs/api.md has no signature of {name} (found {found})"
    return max(signatures, key=len)


def _is_parameter(part: str) -> bool:
    if _param_name(part) is None:
        return False
    if "=" not in part:
        return True
    try:
        return ast.literal_eval(part.split("=", 1)[1].strip()) is not Ellipsis
    except (ValueError, SyntaxError):
        return False


def _split(params: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in params:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [p for p in [*parts, cur.strip()] if p]


def _param_name(part: str) -> str | None:
    name = part.split("=")[0].strip()
    return name if name == "*" or name.isidentifier() else None


@pytest.mark.parametrize("name", DOCUMENTED)
def test_documented_signature_matches_the_code(name):
    params = documented_signature(name)
    code = inspect.signature(getattr(hpcadj, name)).parameters
    keyword_only, documented = False, []
    for part in params:
        pname = _param_name(part)
        if pname == "*":
            keyword_only = True
            continue
        assert pname in code, f"{name}: docs/api.md documents {pname!r}, the code has no such parameter"
        p = code[pname]
        documented.append(pname)
        assert keyword_only == (p.kind is p.KEYWORD_ONLY), f"{name}({pname}): keyword-only in one, not the other"
        if "=" in part:
            default = ast.literal_eval(part.split("=", 1)[1].strip())
            assert p.default is not p.empty and p.default == default, \
                f"{name}({pname}): documented default {default!r}, the code's {p.default!r}"
        else:
            assert p.default is p.empty or p.kind is p.POSITIONAL_OR_KEYWORD and p.default is None, \
                f"{name}({pname}): the code has a default ({p.default!r}) that docs/api.md does not show"
    assert documented == list(code), f"{name}: docs/api.md documents {documented}, the code has {list(code)}"


def test_verification_result_fields_are_documented():
    from hpcadj.adjoint.verify import DotProductResult, TaylorResult

    section = PAGE[PAGE.index("## Verifying a gradient"):PAGE.index("## The Stepper contract")]
    for cls in (TaylorResult, DotProductResult):
        fields = [f for f in vars(cls)["__dataclass_fields__"]] + [
            n for n, v in vars(cls).items() if isinstance(v, property)]
        for field in fields:
            assert f"`{field}`" in section, f"{cls.__name__}.{field} is not in docs/api.md"
    assert "thresholds are the caller's" in section


def test_neighbours_direction_is_stated_and_true():
    """What api.md says of Grid.neighbours(), checked on a grid whose values are their indices."""
    import numpy as np

    from hpcadj import Grid
    from hpcadj.imports import mpi

    row = next(line for line in PAGE.splitlines() if line.startswith("| `neighbours()`"))
    assert "−1 or +1" in row and "index −1 or +1 along that axis" in row and "0 the slowest" in row
    grid = Grid(mpi().COMM_SELF, (5, 4))                      # arrays (4, 5): axis 0 is y
    values = np.arange(20.0).reshape(4, 5) + 1
    padded = grid.padded(grid.vec_from(values))
    seen = []
    for axis, direction, slices, inside in grid.neighbours():
        seen.append((axis, direction))
        expected = np.roll(values, -direction, axis=axis)     # the value at index + direction
        mask = np.broadcast_to(inside, values.shape)
        assert np.array_equal(padded[slices][mask], expected[mask]), (axis, direction)
        assert np.all(padded[slices][~mask] == 0.0) and (~mask).sum() == values.shape[1 - axis]
    assert seen == [(0, -1), (0, 1), (1, -1), (1, 1)]
