"""An error on one rank only ends every command with one line and exit 2, never a hang.

Each entry point under real mpirun with a fault on rank 1 alone, before any work: a --model file,
an observations or cost file, or an output directory rank 1 cannot see (each rank starts in a
directory of its own, so a relative path names a different file there), a user's factory raising
or calling sys.exit on rank 1. Where the other ranks can come to agree, rank 0 prints the line; a
factory failing on rank 1 while rank 0 builds its DMDA (a collective call) can only end the job:
rank 1 prints its line and aborts after $HPCADJ_AGREE_TIMEOUT seconds (shortened here).
"""

from __future__ import annotations

import textwrap

import pytest

from ..helpers import HPCADJ, mpirun


FACTORIES = textwrap.dedent("""
    import sys

    from hpcadj.models.heat import HeatModel


    def build(comm, args):
        return HeatModel(comm, (8, 8), n_steps=2)


    def refuse(comm, args):
        if comm.rank == 1:
            raise RuntimeError("rank one refuses")
        return build(comm, args)


    def leave(comm, args):
        if comm.rank == 1:
            sys.exit(3)
        return build(comm, args)
""")
TINY = ["--grid", "8x8", "--steps", "2"]


@pytest.fixture
def rank_dirs(tmp_path):
    """Directories d0, d1, d2 (one per rank); all but d1 hold ``model.py``, ``costs.json`` (a cost
    profile) and ``obs.h5`` (heat observations of step 2 on the 8x8 grid)."""
    import numpy as np

    from hpcadj.checkpoint.schedules import CostProfile
    from hpcadj.imports import h5py

    for rank in range(3):
        folder = tmp_path / f"d{rank}"
        folder.mkdir()
        if rank != 1:
            (folder / "model.py").write_text(FACTORIES)
            CostProfile.default(1).save(str(folder / "costs.json"))
            with h5py().File(folder / "obs.h5", "w") as f:
                f["steps"] = np.array([2])
                f["u"] = np.zeros((1, 8, 8))
    return tmp_path


def on_ranks(nranks: int, folder, args: list[str], timeout_s: float = 3.0):
    """``hpcadj args`` on ``nranks`` ranks, each started in ``folder/d<rank>``."""
    script = f'cd {folder}/d$OMPI_COMM_WORLD_RANK && exec {HPCADJ} "$@"'
    return mpirun(nranks, ["sh", "-c", script, "sh", *map(str, args)], timeout=300,
                  env={"HPCADJ_AGREE_TIMEOUT": str(timeout_s)})


def assert_one_line_naming_rank_1(proc, *expected: str) -> None:
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("hpcadj: error:")]
    assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "rank 1: " in errors[0] and all(e in errors[0] for e in expected), errors
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command, nranks", [
    (["run", *TINY, "--quiet"], 2), (["gradcheck", *TINY], 3), (["check", *TINY], 2),
    (["hesscheck", *TINY], 2), (["plan", "--ram", "2", *TINY], 2), (["calibrate", *TINY], 2),
    (["invert", *TINY, "--invert", "kappa", "--max-it", "1"], 2)])
def test_a_model_file_rank_1_cannot_see_is_one_agreed_line(rank_dirs, command, nranks):
    proc = on_ranks(nranks, rank_dirs, [*command[:1], "--model", "model.py:build", *command[1:]],
                    timeout_s=60)  # agreed: the other ranks are waiting in the same check
    assert_one_line_naming_rank_1(proc, "--model model.py:build: no such file: model.py")


@pytest.mark.parametrize("factory, what, nranks", [("refuse", "RuntimeError: rank one refuses", 2),
                                                    ("refuse", "RuntimeError: rank one refuses", 3),
                                                    ("leave", "SystemExit: 3", 2)])
def test_a_factory_failing_on_rank_1_ends_the_job_with_its_line(rank_dirs, factory, what, nranks):
    proc = on_ranks(nranks, rank_dirs, ["run", "--model", f"{rank_dirs}/d0/model.py:{factory}", "--quiet"])
    assert_one_line_naming_rank_1(proc, "building the model failed", what)


@pytest.mark.parametrize("command", [
    ["run", "--model", "heat", *TINY, "--ram", "1", "--costs", "costs.json", "--quiet"],
    ["plan", "--model", "heat", *TINY, "--ram", "1", "--costs", "costs.json"],
    ["calibrate", "--model", "heat", *TINY, "--out", "missing/profile.json"],
    ["invert", "--model", "heat", *TINY, "--invert", "kappa", "--observations", "obs.h5"],
], ids=["run-costs", "plan-costs", "calibrate-out", "invert-observations"])
def test_a_file_rank_1_cannot_read_or_write_is_one_agreed_line(rank_dirs, command):
    proc = on_ranks(2, rank_dirs, command, timeout_s=60)
    name = next(a for a in command if a in ("costs.json", "missing/profile.json", "obs.h5"))
    assert_one_line_naming_rank_1(proc, name)
    assert proc.stdout.strip() == "", proc.stdout  # no plan, no profile: nothing that looks like a result
