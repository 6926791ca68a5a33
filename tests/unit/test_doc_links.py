"""Every relative link in README.md, docs/*.md, jobs/README.md and experiments/**/README.md lands on a
file that exists, at a heading that exists (the documents' commands: tests/cli/test_documented_commands.py)."""

from __future__ import annotations

import re
from pathlib import Path

from ..helpers import ROOT

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md")), "jobs/README.md",
        "experiments/README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("experiments/*/README.md"))]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(path: Path) -> str:
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def test_every_relative_link_resolves():
    """A newcomer following a link lands on a file that exists, at a heading that exists."""
    broken = []
    for doc in DOCS:
        path = ROOT / doc
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{doc}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {
                    _slug(h) for h in re.findall(r"^#+\s+(.*)$", _prose(dest), flags=re.M)}:
                broken.append(f"{doc}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
