"""``hpcadj invert`` resumes only what it wrote: an edited ``inversion.json`` is refused on resume (one
line, exit 2, nothing rewritten)."""

import json
import os
import signal
import subprocess
import time

import pytest

from ..helpers import HPCADJ, ROOT, hpcadj, hpcadj_in_process, killed_run, mpi_env

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


FRAGILE = '''
from hpcadj.imports import mpi
from hpcadj.models.base import SolverError
from hpcadj.models.heat import HeatModel


class Fragile(HeatModel):
    """Heat whose solver fails at every kappa but the start's (everywhere 1), or everywhere if ALWAYS."""

    ALWAYS = {always}

    def set_controls(self, controls):
        super().set_controls(controls)
        moved = bool((controls["kappa"].getArray(readonly=True) != 1.0).any())
        self.moved = self.ALWAYS or self.comm.allreduce(moved, op=mpi().LOR)

    def step(self, i, u):
        if self.moved:
            raise SolverError("fragile: KSP diverged (reason -8)")
        return super().step(i, u)


def build(comm, args):
    return Fragile(comm, (10, 8), n_steps=4, dt=1e-3)
'''


def test_a_failed_trial_is_an_infinite_objective_and_tao_backtracks():
    """heat 24x24: lmvm's first trial makes kappa negative and CG diverges there; TAO backtracks."""
    proc = hpcadj_in_process(["invert", "--grid", "24x24", "--steps", "10", "--invert", "kappa", "--max-it", "5",
                              "--json"])
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["status"] == "max_it" and info["iterations"] == 5 and info["failed_evaluations"] >= 1, info


@pytest.mark.parametrize("always, status, words", [(False, 1, "diverged"), (True, 2, "a smaller --dt may help")])
def test_tao_failing_after_failed_trials_exits_1_a_failing_start_2(tmp_path, monkeypatch, always, status, words):
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    path = tmp_path / "fragile.py"
    path.write_text(FRAGILE.format(always=always))
    proc = hpcadj_in_process(["invert", "--model", f"{path}:build", "--invert", "kappa", "--max-it", "3",
                              "--ram", "2"])
    assert proc.returncode == status, (proc.stdout, proc.stderr)
    assert words in proc.stdout + proc.stderr and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)


ADAPTIVE = ["--grid", "10x9", "--dt", "1e-3", "--adaptive", "--t-final", "0.02", "--tolerance", "1e-3"]


def fresh_adaptive_J(path) -> float:
    """J of a gradient session on a fresh adaptive heat model at the controls in ``path``."""
    from hpcadj.adjoint.session import GradientSession
    from hpcadj.imports import h5py, mpi
    from hpcadj.models.heat import HeatModel

    model = HeatModel(mpi().COMM_WORLD, (10, 9), dt=1e-3, adaptive=True, t_final=0.02, tolerance=1e-3)
    controls = model.default_controls()
    with h5py().File(path, "r") as f:
        for name, layout in model.control_layout().items():
            controls[name].getArray()[:] = f[name][layout.slices].ravel()
    return GradientSession(model, controls=controls).solve().result.J


def test_adaptive_inversion_and_its_resume_evaluate_each_control_afresh(tmp_path):
    """Every iterate's J, before and after a resume, is a fresh adaptive session's at its controls."""
    run_dir = tmp_path / "run"
    args = ["invert", *ADAPTIVE, "--invert", "kappa", "--bounds", "kappa:0.5:3", "--ram", "3",
            "--run-dir", str(run_dir), "--json"]
    first = hpcadj_in_process([*args, "--max-it", "2", "--controls-out", str(tmp_path / "k2.h5")])
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    assert info["iterations"] == 2 and info["J"] == fresh_adaptive_J(tmp_path / "k2.h5")
    state = json.loads((run_dir / "inversion.json").read_text())
    again = hpcadj_in_process([*args, "--max-it", "4", "--resume", "--controls-out", str(tmp_path / "k4.h5")])
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout)
    assert info["resumed_from"] == 2 and info["iterations"] == 4, info
    assert info["J"] == fresh_adaptive_J(tmp_path / "k4.h5")
    final = json.loads((run_dir / "inversion.json").read_text())
    assert final["history"][:3] == state["history"] and final["history"][-1]["J"] < state["history"][-1]["J"]


def three_level_args(tmp_path, costs, *extra):
    return ["invert", "--grid", "12x10", "--steps", "10", "--dt", "2e-3", "--invert", "kappa", "--bounds",
            "kappa:0.5:3", "--ram", "1", "--disk", "1", "--pfs", "2", "--schedule", "multilevel",
            "--local-dir", str(tmp_path / "local"), "--pfs-file", str(tmp_path / "ck.h5"),
            "--run-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "log"), *costs, *extra]


def iterates(tmp_path) -> list:
    return [json.loads(line) for line in (tmp_path / "log" / "inversion.jsonl").read_text().splitlines()]


def leftovers(tmp_path) -> list:
    """Files an inversion left outside its run directory and log."""
    found = [str(p.relative_to(tmp_path)) for p in (tmp_path / "local").rglob("*") if p.is_file()]
    return found + (["ck.h5"] if (tmp_path / "ck.h5").exists() else [])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, restart_costs):
    """The log of an inversion to iterate 2, resumed (no kill) up to 4."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    for extra in (["--max-it", "2"], ["--max-it", "4", "--resume"]):
        proc = hpcadj(three_level_args(tmp, restart_costs, *extra), 2, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return iterates(tmp)


@pytest.mark.parametrize("kill", ["injected", "real"])
def test_a_killed_inversion_resumes_with_three_levels_and_leaves_nothing(tmp_path, uninterrupted, restart_costs,
                                                                         kill):
    """Killed in the evaluation after iterate 2 (an injected kill of rank 1, or SIGKILL to a rank from
    outside), --resume takes over the run: bitwise the uninterrupted inversion's iterates, and no
    node-local snapshot or HDF5 file of the killed evaluation is left."""
    first = hpcadj(three_level_args(tmp_path, restart_costs, "--max-it", "2"), 2, timeout=300)
    assert first.returncode == 0, first.stderr
    args = three_level_args(tmp_path, restart_costs, "--max-it", "4", "--resume")
    if kill == "injected":
        killed_run(args, 2, "1:12")
    else:
        real_kill(args, tmp_path)
    assert leftovers(tmp_path), "the kill left no files: the test proves nothing"
    if kill == "injected":  # and what a bntr/nls product's node-local states would have left
        run_id = json.loads((tmp_path / "run" / "owned.json").read_text())["run_id"]
        product = tmp_path / "local" / f"hpcadj-{run_id}-hv" / "rank0"
        product.mkdir(parents=True)
        (product / "step_3.snap").write_bytes(b"\0" * 64)
    again = hpcadj(args, 2, timeout=300)
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stderr.splitlines() if line.startswith("hpcadj: resume: removed")]
    assert len(said) == 1 and str(tmp_path / "local") in said[0], again.stderr
    keys = ("iteration", "J", "misfit", "grad_norm", "step", "controls_hash")
    assert [[r[k] for k in keys] for r in iterates(tmp_path)] == [[r[k] for k in keys] for r in uninterrupted]
    assert leftovers(tmp_path) == []


def real_kill(args, tmp_path):
    """``hpcadj args`` on 2 ranks, rank processes SIGKILLed from outside once the evaluation has put a
    snapshot on the node-local level (steps slowed so it is caught mid-evaluation)."""
    proc = subprocess.Popen(["mpirun", "--oversubscribe", "-n", "2", HPCADJ, *args], cwd=ROOT,
                            env=mpi_env({"HPCADJ_TEST_STEP_DELAY": "0.05", "OMPI_MCA_odls_base_sigkill_timeout": "0"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list((tmp_path / "local").rglob("*.snap")):
            time.sleep(0.02)
        ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert ranks, "no rank process to kill"
        os.kill(int(ranks[-1]), signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0 and out.strip() == "", (proc.returncode, out, err)


def planted_resume(tmp_path, hosts_extra=()):
    """An inversion to iterate 2 under --run-dir, then a killed process's files planted (a node-local
    snapshot of its evaluations and of its products) and ``hosts_extra`` added to owned.json as hosts
    it ran on; the resume to iterate 3, in-process: (its result, owned.json after, the planted dirs)."""
    from hpcadj.restart.rundir import json_crc32

    env = {"HPCADJ_LOCAL_DIR": str(tmp_path / "local")}
    run_dir = tmp_path / "run"
    args = invert_args(run_dir, "--log-dir", str(tmp_path / "log"))
    first = hpcadj_in_process([*args, "--max-it", "2"], env=env)
    assert first.returncode == 0, first.stderr
    owned = json.loads((run_dir / "owned.json").read_text())
    if hosts_extra:
        body = {k: v for k, v in owned.items() if k != "crc32"}
        body["hosts"] = sorted(set(body.get("hosts", [])) | set(hosts_extra))
        (run_dir / "owned.json").write_text(json.dumps({**body, "crc32": json_crc32(body)}))
    planted = []
    for run_id, size in ((owned["run_id"], 3 * 2 ** 20), (owned["run_id"] + "-hv", 2 ** 20)):
        rank = tmp_path / "local" / f"hpcadj-{run_id}" / "rank0"
        rank.mkdir(parents=True)
        (rank / "step_3.snap").write_bytes(b"\0" * size)
        planted.append(rank.parent)
    again = hpcadj_in_process([*args, "--max-it", "3", "--resume"], env=env)
    return again, json.loads((run_dir / "owned.json").read_text()), planted


def test_a_resume_says_what_it_removed_and_logs_it(tmp_path):
    """One stderr line names the count, bytes and directory of what a killed process left; the first
    iterate the resume logs records it; nothing of it is left."""
    again, _owned, planted = planted_resume(tmp_path)
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stderr.splitlines() if line.startswith("hpcadj: resume:")]
    assert len(lines) == 1, again.stderr
    assert "removed 1 node-local snapshot file(s) (3.0 MiB)" in lines[0] and str(planted[0]) in lines[0], lines
    assert "removed 1 node-local snapshot file(s) (1.0 MiB)" in lines[0] and str(planted[1]) in lines[0], lines
    assert not any(p.exists() for p in planted)
    logged = [json.loads(line) for line in (tmp_path / "log" / "inversion.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in logged] == [0, 1, 2, 3]
    assert not any("removed" in r for r in logged[:3]), logged
    assert any("3.0 MiB" in note for note in logged[3]["removed"]), logged


def test_a_resume_on_other_hosts_names_what_it_cannot_reach(tmp_path):
    """A run requeued onto other nodes: the hosts owned.json names that this job does not run on are
    reported with where their files may remain; the resume goes on, and the record keeps every host."""
    import socket

    again, owned, _planted = planted_resume(tmp_path, hosts_extra=["gone-node-17"])
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stderr.splitlines() if line.startswith("hpcadj: resume:")]
    assert len(lines) == 1 and "could not reach gone-node-17" in lines[0], again.stderr
    assert str(tmp_path / "local" / f"hpcadj-{owned['run_id']}") in lines[0], lines
    assert owned["hosts"] == sorted({"gone-node-17", socket.gethostname()}), owned
