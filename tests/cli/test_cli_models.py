"""Models reach the command line through CLI adapters (hpcadj.cli.models), not Stepper hooks; a
plug-in whose entry point names a Stepper class with its own from_args/add_arguments still works,
and a Stepper class without them is built from the shared options."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcadj.cli.models import StepperClassCLI, adapter_for

ROOT = Path(__file__).resolve().parents[2]
HPCADJ = str(ROOT / ".venv" / "bin" / "hpcadj")

LEGACY = '''

class LegacyReaction(ReactionDiffusion):
    """The documented example model with the pre-adapter protocol: CLI classmethods on the Stepper class."""

    name = "legacy"

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument_group("legacy model").add_argument("--legacy-steps", type=int, default=None)

    @classmethod
    def from_args(cls, comm, args):
        return cls(comm, n_steps=args.legacy_steps or args.steps or 50)
'''


def _plugin(tmp_path: Path) -> dict:
    """The documented example module (docs/example.md), plus a legacy Stepper, as package ``mypkg``
    with three entry points: the example's adapter, the legacy class, and a Stepper class with no CLI."""
    text = (ROOT / "docs" / "example.md").read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                   if "class ReactionDiffusion(Stepper)" in b)
    head = example.split('\nif __name__ == "__main__":')[0]
    pkg = tmp_path / "site"
    (pkg / "mypkg").mkdir(parents=True)
    (pkg / "mypkg" / "__init__.py").write_text("")
    (pkg / "mypkg" / "reaction.py").write_text(head + LEGACY)
    info = pkg / "mypkg-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[hpcadj.models]\nreaction = mypkg.reaction:ReactionCLI\nlegacy = mypkg.reaction:LegacyReaction\n"
        "bare = mypkg.reaction:ReactionDiffusion\n")
    env = dict(os.environ, PYTHONPATH=str(pkg), HPCADJ_PROGRESS_INTERVAL="3600")
    return env


def _run(args, env):
    return subprocess.run([HPCADJ, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.timeout(180)
def test_adapter_and_legacy_plugins_on_the_command_line(tmp_path):
    env = _plugin(tmp_path)
    sys.path.insert(0, env["PYTHONPATH"])
    try:
        import mypkg.reaction as mod

        assert isinstance(adapter_for(mod.LegacyReaction), StepperClassCLI)
        assert isinstance(adapter_for(mod.ReactionCLI), mod.ReactionCLI)
    finally:
        sys.path.remove(env["PYTHONPATH"])
        sys.modules.pop("mypkg.reaction", None)
        sys.modules.pop("mypkg", None)
    legacy = _run(["run", "--model", "legacy", "--legacy-steps", "6", "--json"], env)
    assert legacy.returncode == 0, legacy.stderr
    info = json.loads(legacy.stdout.strip().splitlines()[-1])
    assert info["model"] == "legacy" and info["adjoint_steps"] == 6, info
    adapted = _run(["run", "--model", "reaction", "--steps", "5", "--json"], env)
    assert adapted.returncode == 0, adapted.stderr
    assert json.loads(adapted.stdout.strip().splitlines()[-1])["adjoint_steps"] == 5
    bare = _run(["run", "--model", "bare", "--steps", "4", "--json"], env)  # built from the shared options
    assert bare.returncode == 0 and json.loads(bare.stdout)["adjoint_steps"] == 4, bare.stderr
    refused = _run(["run", "--model", "heat", "--legacy-steps", "3"], env)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1 and "an option of model legacy" in lines[0], refused.stderr
