"""docs/inversion.md's library example runs as written (1 rank, in-process)."""

import re

from ..helpers import ROOT


def test_inversion_page_example_runs():
    text = (ROOT / "docs" / "inversion.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/inversion.md", "exec"), {})
