"""docs/api.md: every example runs as documented, on 1 and 2 ranks (each checks its own results), and
every name ``hpcadj`` exports is importable from it and documented there."""

import ast
import inspect
import re
import subprocess
import sys

import pytest

import hpcadj

from ..helpers import PYTHON, ROOT, mpirun

PAGE = (ROOT / "docs" / "api.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", PAGE, flags=re.S)


def test_the_page_has_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.timeout(400)
@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_example_runs(index, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLES[index])
    for nranks in (1, 2):
        proc = mpirun(nranks, [PYTHON, str(script), str(tmp_path / f"work{nranks}")], timeout=180)
        assert proc.returncode == 0, f"example {index} on {nranks} rank(s):\n{proc.stdout}\n{proc.stderr}"


def test_every_export_is_importable_and_documented():
    assert hpcadj.__all__ and len(set(hpcadj.__all__)) == len(hpcadj.__all__)
    exec(f"from hpcadj import {', '.join(hpcadj.__all__)}", {})   # the import a user writes
    for name in hpcadj.__all__:
        assert getattr(hpcadj, name) is not None, name
        assert f"`{name}`" in PAGE, f"hpcadj.{name} is exported but docs/api.md does not mention it"
    with pytest.raises(AttributeError):
        hpcadj.not_an_export  # noqa: B018 - the attribute access is the test


def test_import_hpcadj_loads_no_petsc():
    """``import hpcadj`` stays light (the command line starts with it): the names load on first use."""
    code = ("import sys, hpcadj; "
            "print(sorted(m for m in ('petsc4py.PETSc', 'mpi4py.MPI', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_readme_sketch_names_the_real_api():
    """README.md's Stepper outline is not run (docs/example.md's full model is): it must still parse,
    import only hpcadj's exports, define only Stepper methods and pass only real keyword arguments."""
    readme = (ROOT / "README.md").read_text()
    sketch = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "(Stepper)" in b)
    tree = ast.parse(sketch)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "hpcadj"
                for a in n.names}
    assert imported and imported <= set(hpcadj.__all__), imported - set(hpcadj.__all__)
    methods = {f.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
               if isinstance(f, ast.FunctionDef)}
    assert methods and all(hasattr(hpcadj.Stepper, m) for m in methods), methods
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in imported:
            params = inspect.signature(getattr(hpcadj, call.func.id)).parameters
            assert {k.arg for k in call.keywords} <= set(params), (call.func.id, params)
