"""``hpcadj invert``: bad input is one line and exit 2 with nothing lost; SIGUSR1 stops a 2-rank
inversion with status 75 at the end of an evaluation, and --resume continues from its last
accepted iterate; --time-limit stops before the first iterate and the resume starts afresh."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from hpcadj.cli import main

from ..helpers import HPCADJ, ROOT, mpi_env

GRID, N, DT, OBSERVED = (12, 10), 10, 2e-3, [2, 4, 6, 8, 10]


@pytest.fixture(scope="module")
def observations(tmp_path_factory):
    """u at the observed steps of a heat run with kappa = 1 + 0.8 sin(pi x) sin(pi y)."""
    from hpcadj.models.heat import HeatModel
    from hpcadj.imports import h5py, mpi

    comm = mpi().COMM_WORLD
    truth = HeatModel(comm, grid=GRID, n_steps=N, dt=DT)
    c = truth.default_controls()
    y, x = truth.grid.node_coordinates()
    truth.grid.owned(c["kappa"])[...] = 1.0 + 0.8 * np.sin(np.pi * x) * np.sin(np.pi * y)
    truth.set_controls(c)
    u, states = truth.initial_state(), []
    for i in range(N):
        u = truth.step(i, u)
        if i + 1 in OBSERVED:
            states.append(truth.grid.owned_view(u).copy())
    path = str(tmp_path_factory.mktemp("obs") / "obs.h5")
    with h5py().File(path, "w") as f:
        f["steps"] = np.array(OBSERVED)
        f["u"] = np.array(states)
    return path


def base(observations):
    return ["invert", "--grid", "x".join(map(str, GRID)), "--steps", str(N), "--dt", str(DT),
            "--observations", observations, "--invert", "kappa", "--ram", "3", "--schedule", "revolve"]


@pytest.fixture
def restore_signals():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("extra, message", [
    (["--bounds", "kappa:3:0.5"], "lower bound 3 must be below the upper bound 0.5"),
    (["--bounds", "kappa:2:2"], "lower bound 2 must be below"),
    (["--bounds", "kappa:0.5"], "expected NAME:LOW:HIGH"),
    (["--bounds", "u0:0:1"], "not an inverted control"),
    (["--regularization", "-0.1"], "regularisation weight must be >= 0"),
    (["--tao", "lmvm", "--bounds", "kappa:0.5:3"], "bounds need a bounded method"),
    (["--invert", "nu"], "the model's controls are"),
    (["--resume"], "--resume needs --run-dir"),
    (["--max-it", "-1"], "--max-it: must be between 0 and 2147483647 (PETSc's int), got -1"),
    (["--max-it", "3000000000"], "--max-it: must be between 0 and 2147483647 (PETSc's int), got 3000000000"),
    (["--invert", "kappa,kappa"], "--invert kappa,kappa: kappa is named twice"),
    (["--tao", "bntr", "--bounds", "kappa:0.5:3", "--ram", "1"], "a Hessian product needs at least 2 slots"),
])
def test_bad_input_is_one_line_and_exit_2(observations, capsys, restore_signals, extra, message):
    assert main([*base(observations), *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err, err


def test_invert_recovers_kappa_and_logs_each_iterate(observations, tmp_path, capsys, restore_signals):
    args = [*base(observations), "--bounds", "kappa:0.5:3", "--max-it", "6", "--log-dir", str(tmp_path / "log"),
            "--controls-out", str(tmp_path / "k.h5"), "--json", "-tao_ls_type", "armijo"]
    assert main(args) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["status"] == "max_it" and info["iterations"] == 6
    lines = [json.loads(line) for line in (tmp_path / "log" / "inversion.jsonl").read_text().splitlines()]
    misfits = [r["misfit"] for r in lines]
    assert [r["iteration"] for r in lines] == list(range(7))
    assert all(b < a for a, b in zip(misfits, misfits[1:])) and misfits[-1] == info["misfit"]
    # Armijo asks g at the accepted point only: the default policy (keep) runs just its reverse sweep
    assert info["reverse_from_kept"] >= 6 and info["forward_sweeps"] == 0
    assert info["forward_steps"] < 0.8 * info["naive_forward_steps"], info
    from hpcadj.imports import h5py

    with h5py().File(tmp_path / "k.h5", "r") as f:
        kappa = f["kappa"][...]
    assert 0.5 <= kappa.min() and kappa.max() <= 3.0 and kappa.max() > 1.2


def test_time_limit_stops_before_the_first_iterate_and_resume_starts_afresh(observations, tmp_path, capsys,
                                                                            restore_signals):
    run_dir = str(tmp_path / "run")
    args = [*base(observations), "--max-it", "3", "--run-dir", run_dir, "--json"]
    assert main([*args, "--time-limit", "1e-9"]) == 75
    out, err = capsys.readouterr()
    assert out.strip() and "continue with --resume" in err
    assert not os.path.exists(os.path.join(run_dir, "inversion.json"))
    assert main([*args, "--resume"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["iterations"] == 3 and info["resumed_from"] is None


def test_a_resume_under_another_tao_type_option_is_refused(observations, tmp_path, capsys, restore_signals):
    """-tao_type overrides --tao, so the run directory records the type TAO really used."""
    args = [*base(observations), "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--max-it", "1", "-tao_type", "blmvm"]) == 0
    state = json.loads((tmp_path / "run" / "inversion.json").read_text())
    assert state["identity"]["tao_type"] == "blmvm", state["identity"]
    capsys.readouterr()
    assert main([*args, "--max-it", "2", "--resume"]) == 2  # lmvm now: another inversion
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "tao_type: recorded 'blmvm', now 'lmvm'" in err, err
    assert main([*args, "--max-it", "2", "--resume", "--tao", "lmvm", "-tao_type", "blmvm"]) == 0


def test_sigusr1_stops_with_75_and_resume_continues(observations, tmp_path, capsys, restore_signals):
    run_dir, log = tmp_path / "run", tmp_path / "log" / "inversion.jsonl"
    args = [*base(observations), "--max-it", "8", "--run-dir", str(run_dir), "--log-dir", str(tmp_path / "log")]
    proc = subprocess.Popen(["mpirun", "--oversubscribe", "-n", "2", HPCADJ, *args], cwd=ROOT,
                            env=mpi_env({"HPCADJ_TEST_STEP_DELAY": "0.01"}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 75, (proc.returncode, out, err)
    assert "continue with --resume" in err
    state = json.loads((run_dir / "inversion.json").read_text())
    k = state["iteration"]
    assert 2 <= k < 8 and [h["iteration"] for h in state["history"]] == list(range(k + 1))
    before = (run_dir / state["controls_file"]).read_bytes()

    # a corrupt controls file: one line, exit 2, nothing removed or rewritten
    damaged = bytearray(before)
    damaged[len(damaged) // 2] ^= 0xFF
    (run_dir / state["controls_file"]).write_bytes(bytes(damaged))
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and len(err.strip().splitlines()) == 1, err
    assert json.loads((run_dir / "inversion.json").read_text()) == state
    (run_dir / state["controls_file"]).write_bytes(before)

    # resumed on 1 rank (the controls file is global, natural-ordered): from iterate k up to 8
    assert main([*args, "--resume", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["resumed_from"] == k and info["iterations"] == 8 and info["status"] == "max_it"
    final = json.loads((run_dir / "inversion.json").read_text())
    assert final["history"][:k + 1] == state["history"]
    misfits = [h["misfit"] for h in final["history"]]
    assert all(b < a for a, b in zip(misfits, misfits[1:])), misfits


def test_a_users_model_file_is_inverted(tmp_path, monkeypatch, capsys, restore_signals):
    """--model path/to/file.py:Name as for run: docs/example.md's model, its field ``a`` inverted."""
    import sys

    from .test_model_spec import readme_model

    monkeypatch.setattr(sys, "path", list(sys.path))
    path = tmp_path / "reaction.py"
    path.write_text(readme_model())
    args = ["invert", "--model", f"{path}:ReactionDiffusion", "--grid", "10x8", "--steps", "4", "--dt", "1e-4",
            "--invert", "a", "--max-it", "3", "--ram", "2", "--log-dir", str(tmp_path / "log"), "--json"]
    assert main(args) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model"] == "reaction" and info["iterations"] == 3, info
    lines = [json.loads(line) for line in (tmp_path / "log" / "inversion.jsonl").read_text().splitlines()]
    assert info["sessions"] >= 4 and info["J"] == lines[-1]["J"] < lines[0]["J"], (info, lines)
