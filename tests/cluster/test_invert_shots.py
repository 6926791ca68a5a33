"""jobs/invert.sbatch on the private 3-node SLURM cluster (tests/slurm_cluster.py): 6 shots of 2 ranks
over 3 nodes give the gradient of the 6 shots run one after another on one rank and added in shot
order, and each iterate's joules are every node's (a fake RAPL counter per node, advanced by the
test at its own rate). Run by `make test-cluster` (HPCADJ_TEST_CLUSTER=1), not by `make test`."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from ..helpers import HPCADJ, PYTHON, ROOT, mpi_env, run
from ..slurm_cluster import LOOPBACK_MPI, SlurmCluster, SlurmUnavailable, ensure_installed

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(os.environ.get("HPCADJ_TEST_CLUSTER") != "1",
                                 reason="multi-node SLURM tests: run with `make test-cluster` (HPCADJ_TEST_CLUSTER=1)")]

WAIT = 300  # seconds for the job on a busy 2-core machine
GRID, STEPS, SHOTS = "16x16", 24, 6

#: the shots one after another on one rank, store-all, at the job's final controls, added in shot order
REFERENCE = """
import sys
import h5py
import numpy as np
from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.imports import mpi
from hpcadj.inversion.shots import shot_positions
from hpcadj.models.wave import WaveModel

controls, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(controls, "r") as f:
    c = np.array(f["c"])
J, g = None, None
for x in shot_positions(n):
    model = WaveModel(mpi().COMM_SELF, (16, 16), n_steps=24, source_x=x)
    start = model.default_controls()
    start["c"].getArray()[:] = c.ravel()
    result = GradientSession(model, Checkpointing(), controls=start).solve().result
    gk = model.control_arrays(result.gradient)["c"].reshape(c.shape)
    J = result.J if J is None else J + result.J
    g = gk if g is None else g + gk
np.savez(out, J=J, g=g)
"""


@pytest.fixture(scope="module")
def cluster():
    try:
        ensure_installed()
    except SlurmUnavailable as exc:
        pytest.skip(f"SLURM cannot be installed here: {exc}")
    c = SlurmCluster(nodes=3, cpus=6, powercap=True)
    try:
        try:
            c.start()
        except RuntimeError as exc:
            if "unshare" in str(exc) or "Operation not permitted" in str(exc):
                pytest.skip(f"per-node namespaces not permitted here: {exc}")
            raise
        yield c
    finally:
        c.stop()  # cancels the jobs, stops every slurmd, slurmctld and munged by pid


#: watts of each node's fake package counter: any one node's (a shot group's) share is far from the sum
WATTS = {"node1": 1.0, "node2": 10.0, "node3": 100.0}


class Power:
    """Advances every node's fake RAPL counter at WATTS[node] of wall time (atomic rewrites, every 5 ms)
    while the job runs."""

    def __init__(self, cluster):
        self.files = {n: cluster.node_powercap(n) / "intel-rapl:0" / "energy_uj" for n in WATTS}
        self.base = {n: int(f.read_text()) for n, f in self.files.items()}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        t0 = time.monotonic()
        while not self.done.wait(0.005):
            dt = time.monotonic() - t0
            for node, path in self.files.items():
                tmp = path.with_name("energy_uj.tmp")
                tmp.write_text(f"{self.base[node] + int(WATTS[node] * dt * 1e6)}\n")
                os.replace(tmp, path)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def batch_output(submit_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(submit_dir.glob("*.out")))


def test_six_shots_over_three_nodes_are_the_shots_in_turn_summed(cluster, tmp_path):
    """--nodes=3 --ntasks=6, 2 ranks a shot: 3 groups, one per node, 2 shots each, RAM + node-local +
    HDF5 levels; one L-BFGS iterate; the gradient at the final controls equals the 6 shots run in turn."""
    import numpy as np

    from hpcadj.imports import h5py as mpi_h5py

    h5py = mpi_h5py()  # the MPI build: a plain import first would fix the serial one in this process

    env = mpi_env({"HPCADJ": HPCADJ, "HPCADJ_OUTPUT": str(tmp_path / "hpcadj-jobs"), "PYTHONPATH": str(ROOT),
                   "TMPDIR": str(tmp_path / "tmp"), "SLURM_TMPDIR": str(cluster.local_dir), **LOOPBACK_MPI,
                   "HPCADJ_GRID": GRID, "HPCADJ_STEPS": str(STEPS), "HPCADJ_SHOTS": str(SHOTS),
                   "HPCADJ_RANKS_PER_SHOT": "2", "HPCADJ_MAX_IT": "1", "HPCADJ_RAM": "3", "HPCADJ_DISK": "4",
                   "HPCADJ_PFS": "8"})
    env.pop("HPCADJ_MPI_WORKER", None)
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_TMPDIR"}
    job = cluster.sbatch(["--nodes=3", "--ntasks=6", "--ntasks-per-node=2", str(ROOT / "jobs" / "invert.sbatch")],
                         env=env, cwd=tmp_path)
    with Power(cluster):
        records = cluster.wait(job, WAIT)
    assert [r.get("JobState") for r in records] == ["COMPLETED"], batch_output(tmp_path) + cluster.log_tails(30)

    job_dir = tmp_path / "hpcadj-jobs" / f"invert-{job}"
    assert (job_dir / "COMPLETE").is_file(), batch_output(tmp_path)
    result = json.loads((job_dir / "result.json").read_text())
    assert result["ranks"] == 6 and result["shots"] == SHOTS and result["shot_groups"] == 3, result
    assert result["nodes"] == 3 and result["groups_across_nodes"] == 0, result  # a shot's ranks on one node
    assert result["iterations"] == 1 and (job_dir / "state" / "inversion.json").is_file()
    assert not list(cluster.local_dir.iterdir()), "node-local files leaked outside the nodes"

    out = tmp_path / "reference.npz"
    proc = run([PYTHON, "-c", REFERENCE, str(job_dir / "controls.h5"), str(out), str(SHOTS)],
               env=mpi_env({"PYTHONPATH": str(ROOT)}), timeout=300)
    assert proc.returncode == 0, proc.stderr
    ref = np.load(out)
    with h5py.File(job_dir / "gradient.h5", "r") as f:
        g, J = np.array(f["grad_c"]), float(f.attrs["J"])
    assert g.shape == ref["g"].shape and np.abs(ref["g"]).max() > 0
    # a shot on 2 ranks: the gradient is pointwise, the same bits as on one rank; J's per-step sums over
    # the receivers are reduced over the 2 ranks, so J agrees to rounding
    assert g.tobytes() == ref["g"].tobytes(), np.abs(g - ref["g"]).max()
    assert J == pytest.approx(float(ref["J"]), rel=1e-13, abs=0)
    assert result["misfit"] == J

    # joules of every node, read once each over all groups: the sum of the three rates, not one node's
    log = [json.loads(line) for line in (job_dir / "inversion.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in log] == [0, 1] and all(r["energy_source"] == "rapl" for r in log), log
    watts = [r["joules"] / r["seconds"] for r in log]
    assert all(0.7 * sum(WATTS.values()) < w < 1.3 * sum(WATTS.values()) for w in watts), watts
