"""`hpcadj run --model burgers|wave|grayscott` on 1, 2 and 3 ranks: the JSON keys, the snapshot size,
and J and every gradient field (written with --gradient-out) invariant across rank counts.

Runs on one rank call ``hpcadj.cli.main`` in this process where no PETSc option is given (PETSc
takes its options once per process), those on 2 and 3 ranks one mpirun a rank count for all models,
and the real command runs for each behaviour's exit status."""

import json

import numpy as np
import pytest

from ..helpers import hpcadj, hpcadj_each, hpcadj_in_process, hpcadj_json

CASES = {
    # model: (grid, steps, controls, relative tolerance across rank counts)
    "burgers": ("12x9", 6, ["nu", "u0"], 1e-13),
    "wave": ("14x12", 20, ["c", "u0"], 1e-13),
    "grayscott": ("10x9", 4, ["F", "k", "u0"], 1e-10),
}
KEYS = {"model", "grid", "steps", "ranks", "J", "grad_norm", "forward_steps", "adjoint_steps",
        "snapshot_bytes", "wall_s"}


def _read(path):
    from hpcadj.imports import h5py

    with h5py().File(path, "r") as f:
        return {name: np.array(f[name][...]) for name in f}


def _command(model, out):
    grid, steps, _, _ = CASES[model]
    return ["run", "--model", model, "--grid", grid, "--steps", str(steps), "--gradient-out", str(out), "--json"]


@pytest.fixture(scope="module")
def multi_rank(tmp_path_factory):
    """{(model, nranks): (run --json object, gradient fields)} on 2 and 3 ranks: every model's run on
    N ranks in one mpirun (hpcadj_each), so ranks' start-up is paid once a rank count."""
    tmp = tmp_path_factory.mktemp("ranks")
    out = {}
    for nranks in (2, 3):
        paths = {model: tmp / f"{model}{nranks}.h5" for model in sorted(CASES)}
        procs = hpcadj_each([_command(model, path) for model, path in paths.items()], nranks, timeout=240)
        for (model, path), proc in zip(paths.items(), procs):
            assert proc.returncode == 0, (model, nranks, proc.stdout, proc.stderr[-2000:])
            out[model, nranks] = json.loads(proc.stdout.strip().splitlines()[-1]), _read(path)
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", sorted(CASES))
def test_run_json_and_rank_invariance(model, tmp_path, multi_rank):
    grid, steps, controls, rtol = CASES[model]
    out = tmp_path / "grad1.h5"
    runs = {1: hpcadj_json(_command(model, out)[:-1], in_process=True)}
    fields = {1: _read(out)}
    for nranks in (2, 3):
        runs[nranks], fields[nranks] = multi_rank[model, nranks]
    info = runs[1]
    assert KEYS | {f"grad_{c}_norm" for c in controls if c != "u0"} <= set(info)
    assert (info["model"], info["grid"], info["steps"]) == (model, grid, steps)
    assert info["forward_steps"] == info["adjoint_steps"] == steps
    nx, ny = (int(n) for n in grid.split("x"))
    assert info["snapshot_bytes"] == 2 * nx * ny * 8  # two float64 fields per grid point
    assert sorted(fields[1]) == sorted(f"grad_{c}" for c in controls)
    assert np.isclose(info["grad_norm"], np.linalg.norm(fields[1]["grad_u0"]), rtol=1e-12)
    for nranks in (2, 3):
        assert runs[nranks]["ranks"] == nranks
        assert abs(runs[nranks]["J"] - info["J"]) <= rtol * abs(info["J"])
        for name, field in fields[1].items():
            assert np.max(np.abs(field)) > 0, name
            assert np.max(np.abs(fields[nranks][name] - field)) <= rtol * np.max(np.abs(field)), (nranks, name)


@pytest.mark.timeout(120)
def test_wave_3d_and_observed_options(tmp_path):
    info = hpcadj_json(["run", "--model", "wave", "--grid", "8x7x9", "--steps", "10"], 2)
    assert info["grid"] == "8x7x9" and info["snapshot_bytes"] == 2 * 8 * 7 * 9 * 8 and info["J"] > 0
    explicit = hpcadj_json(["run", "--model", "wave", "--grid", "14x12", "--steps", "10",
                            "--observed-from-model"], in_process=True)
    default = hpcadj_json(["run", "--model", "wave", "--grid", "14x12", "--steps", "10"], in_process=True)
    assert explicit["J"] == default["J"]
    stronger = hpcadj_json(["run", "--model", "wave", "--grid", "14x12", "--steps", "10", "--anomaly", "0.2"],
                           in_process=True)
    assert stronger["J"] > default["J"]
    both = hpcadj(["run", "--model", "wave", "--observed", str(tmp_path / "x.h5"), "--observed-from-model"])
    assert both.returncode != 0 and "not both" in both.stderr
    missing = hpcadj_in_process(["run", "--model", "wave", "--grid", "14x12", "--observed",
                                 str(tmp_path / "none.h5")])
    assert missing.returncode != 0 and "not found" in missing.stderr


@pytest.mark.timeout(120)
def test_gradcheck_passes_for_each_model():
    for model, (grid, steps, _controls, _rtol) in CASES.items():
        info = hpcadj_json(["gradcheck", "--model", model, "--grid", grid, "--steps", str(steps)], 2)
        assert info["passed"], info


def test_help_lists_every_model():
    proc = hpcadj(["run", "--help"])
    assert proc.returncode == 0
    for model in ("heat", "burgers", "wave", "grayscott"):
        assert model in proc.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model,foreign", [("heat", ["--viscosity", "0.1"]), ("burgers", ["--theta", "1"]),
                                           ("wave", ["--feed", "0.04"]), ("grayscott", ["--anomaly", "0.2"])])
def test_another_models_option_is_refused(model, foreign):
    """An option of another model was silently ignored; now one error line naming it, exit 2."""
    argv = ["run", "--model", model, "--grid", "8x8", "--steps", "2", *foreign]
    proc = hpcadj(argv) if model == "heat" else hpcadj_in_process(argv)  # one real command
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"hpcadj: error: model {model} does not use {foreign[0]}"), lines


@pytest.mark.timeout(120)
def test_grayscott_jacobian_is_a_petsc_option():
    """-grayscott_jacobian assembled is taken (and named in the JSON); an unknown kind is refused."""
    assembled = hpcadj_json(["run", "--model", "grayscott", "--grid", "10x9", "--steps", "3",
                             "-grayscott_jacobian", "assembled"], 1)
    stencil = hpcadj_json(["run", "--model", "grayscott", "--grid", "10x9", "--steps", "3"], 1)
    assert (assembled["jacobian"], stencil["jacobian"]) == ("assembled", "stencil")
    assert abs(assembled["J"] - stencil["J"]) <= 1e-10 * abs(stencil["J"])
    proc = hpcadj(["run", "--model", "grayscott", "--grid", "8x8", "--steps", "2", "-grayscott_jacobian", "dense"])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "'dense'" in lines[0], proc.stderr
