"""The user-defined model of docs/example.md (the README links to it) runs as documented, on 1 and 2
ranks, with a correct gradient."""

import json
import re

from ..helpers import PYTHON, ROOT, mpirun


def readme_example(tmp_path):
    text = (ROOT / "docs" / "example.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "class ReactionDiffusion(Stepper)" in b)
    path = tmp_path / "reaction.py"
    path.write_text(example)
    return path


def test_readme_user_model_gradient_is_verified(tmp_path):
    script = readme_example(tmp_path)
    for nranks in (1, 2):
        work = tmp_path / f"work{nranks}"
        proc = mpirun(nranks, [PYTHON, str(script), str(work)], timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rate = float(re.search(r"Taylor rate \(a\): (\S+)", proc.stdout).group(1))
        mismatch = float(re.search(r"dot-product mismatch: (\S+)", proc.stdout).group(1))
        assert rate >= 1.95 and mismatch <= 1e-10, proc.stdout
        # the checkpointed gradient: three levels, recomputation, bitwise the store-all one
        line = re.search(r"checkpointed: (\S+) over \[(.*?)\] (\d+) forward steps for (\d+); "
                         r"bitwise equal to store-all: (\w+)", proc.stdout)
        assert line, proc.stdout
        assert line.group(2) == "'ram', 'disk', 'pfs'" and int(line.group(3)) > int(line.group(4))
        assert line.group(5) == "True", proc.stdout
        # logged for `hpcadj analyze`, restartable, and no checkpoint file left behind
        summary = json.loads((work / "logs" / "summary.json").read_text())
        assert summary["result"]["forward_steps"] == int(line.group(3))
        manifest = json.loads((work / "run" / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert not (work / "ckpt.h5").exists() and not (work / "local").exists()  # the level made it
