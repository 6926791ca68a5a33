"""A CN TS run resumed on another rank count at PETSc's default Krylov tolerance is refused with the
difference and the remedy (the refusal's wording alone: tests/unit/test_trajectory_refusal.py)."""

from ..helpers import hpcadj, killed_run


def test_a_cn_ts_resumed_on_another_rank_count_at_the_default_krylov_tolerance(tmp_path):
    """GMRES at rtol 1e-5 (the example's own tolerances are tight; -ksp_rtol restores PETSc's default):
    the adjoint step differs by about 9e-8 between 1 and 2 ranks."""
    args = ["run", "--model", "hpcadj.ts.examples:grayscott_stepper", "--grid", "32", "--steps", "4", "--ram", "3",
            "--run-dir", str(tmp_path / "run"), "--durable-every", "1", "--quiet", "-ksp_rtol", "1e-5"]
    killed_run(args, 1, "0:6", timeout=120)
    proc = hpcadj([*args, "--resume"], 2, timeout=200)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "run on 1 rank and cannot resume on 2" in lines[0] and "relative" in lines[0], lines[0]
    assert "-ksp_rtol 1e-12" in lines[0] and "another configuration" not in lines[0], lines[0]
