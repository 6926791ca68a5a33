"""Every example in docs/api.md runs as documented, on 1 and 2 ranks (each checks its own results)."""

import re

import pytest

from .helpers import PYTHON, ROOT, mpirun

EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), flags=re.S)


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
