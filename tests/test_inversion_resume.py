"""``hpcadj invert`` resumes only what it wrote: an edited ``inversion.json`` is refused on resume (one
line, exit 2, nothing rewritten)."""

import json
import os

import pytest

from .helpers import hpcadj_in_process

GRID, N, DT = "10x8", 8, 2e-3


def invert_args(run_dir, *extra):
    return ["invert", "--grid", GRID, "--steps", str(N), "--dt", str(DT), "--invert", "kappa",
            "--bounds", "kappa:0.5:3", "--ram", "3", "--schedule", "revolve", "--run-dir", str(run_dir),
            *extra]


@pytest.mark.parametrize("edit", ["J", "history"])
def test_an_edited_state_is_refused_on_resume(tmp_path, edit):
    run_dir = tmp_path / "run"
    first = hpcadj_in_process(invert_args(run_dir, "--max-it", "2"))
    assert first.returncode == 0, first.stderr
    path = run_dir / "inversion.json"
    state = json.loads(path.read_text())
    if edit == "J":
        state["last"]["J"] *= 0.5
    else:
        state["history"][0]["misfit"] = 0.0
    path.write_text(json.dumps(state, indent=1))
    edited, files = path.read_bytes(), sorted(os.listdir(run_dir))
    again = hpcadj_in_process(invert_args(run_dir, "--max-it", "4", "--resume"))
    assert again.returncode == 2, again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcadj: error:") and "checksum" in lines[0], again.stderr
    assert path.read_bytes() == edited and again.stdout == ""
    assert sorted(os.listdir(run_dir)) == files
