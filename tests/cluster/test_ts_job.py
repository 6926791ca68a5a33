"""A user's own petsc4py TS under jobs/gradient.sbatch on the private 3-node SLURM cluster
(tests/slurm_cluster.py), submitted as docs/ts.md shows it: ``HPCADJ_MODEL=my_ts.py:build`` with the
page's own model file, PETSc options in ``HPCADJ_EXTRA_ARGS``. Run by `make test-cluster`
(HPCADJ_TEST_CLUSTER=1), not by `make test`."""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from ..helpers import (HPCADJ, ROOT, assert_jobs_completed, mpirun, rank_hosts, read_gradients, slurm_cluster,
                       slurm_job_env)
from ..slurm_cluster import LOOPBACK_MPI

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(os.environ.get("HPCADJ_TEST_CLUSTER") != "1",
                                 reason="multi-node SLURM tests: run with `make test-cluster` (HPCADJ_TEST_CLUSTER=1)")]

WAIT = 300  # seconds for the jobs on a busy 2-core machine
PAGE = (ROOT / "docs" / "ts.md").read_text()
EXAMPLE = re.findall(r"```python\n(.*?)```", PAGE, flags=re.S)[0]
#: the page's sbatch line, as a user types it
SBATCH_LINE = next(ln for ln in PAGE.splitlines() if ln.rstrip().endswith("sbatch jobs/gradient.sbatch"))
STEPS = 40
#: the TS's method -> (nodes = ranks, PETSc options; None: the page's): CN fills the adjoint's stages,
#: RK4 recomputes its step
CASES = {"cn": (3, None), "rk4": (2, "-ts_type rk -ts_rk_type 4")}


@pytest.fixture(scope="module")
def cluster():
    yield from slurm_cluster(nodes=3, cpus=6)


def docs_variables() -> dict:
    """The HPCADJ_* assignments of the page's sbatch line."""
    words = shlex.split(SBATCH_LINE)
    assert words[-2:] == ["sbatch", "jobs/gradient.sbatch"], SBATCH_LINE
    return dict(w.split("=", 1) for w in words[:-2])


def test_users_ts_job_across_nodes_is_the_local_run(cluster, tmp_path):
    """The page's model file and job, CN on 3 nodes x 1 rank and RK4 on 2 nodes x 1 rank, three levels
    (RAM, node-local, HDF5) with recomputation: each gradient bitwise equal to the same file run by
    mpirun on as many ranks on this host, store-all (the same decomposition and the same floating-point
    operations; only the states' storage and the transport between ranks differ)."""
    (tmp_path / "my_ts.py").write_text(EXAMPLE)
    variables = docs_variables()
    assert variables["HPCADJ_MODEL"] == "my_ts.py:build" and variables["HPCADJ_GRID"] == ""
    assert variables["HPCADJ_EXTRA_ARGS"] == "-ts_type cn", variables
    options = {name: shlex.split(opts or variables["HPCADJ_EXTRA_ARGS"]) for name, (_, opts) in CASES.items()}
    jobs = {}
    for name, (nodes, _) in CASES.items():
        sizes = {"HPCADJ_STEPS": STEPS, "HPCADJ_RAM": 2, "HPCADJ_DISK": 3, "HPCADJ_PFS": 8,
                 "HPCADJ_EXTRA_ARGS": shlex.join(["--gradient-out", str(tmp_path / f"{name}-job.h5"), *options[name]])}
        env = slurm_job_env(tmp_path, {"SLURM_TMPDIR": str(cluster.local_dir), **LOOPBACK_MPI},
                            keep=("SLURM_TMPDIR",), **{**variables, **sizes})
        jobs[name] = cluster.sbatch([f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
                                     str(ROOT / "jobs" / "gradient.sbatch")], env=env, cwd=tmp_path)

    local = {}
    for name, (nodes, _) in CASES.items():  # while the jobs run: the same file, store-all
        out = tmp_path / f"{name}-local.h5"
        proc = mpirun(nodes, [HPCADJ, "run", "--model", "my_ts.py:build", "--steps", str(STEPS), "--json",
                              "--gradient-out", str(out), *options[name]], cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
        local[name] = json.loads(proc.stdout.strip().splitlines()[-1]), read_gradients(out)

    for name, (nodes, _) in CASES.items():
        assert_jobs_completed(cluster, jobs[name], tmp_path, WAIT)
        job_dir = tmp_path / "hpcadj-jobs" / f"gradient-{jobs[name]}"
        assert (job_dir / "COMPLETE").is_file()
        result = json.loads((job_dir / "result.json").read_text())
        assert result["model"] == "my_ts" and result["ranks"] == nodes and result["steps"] == STEPS, result
        assert result["adjoint_stages"] == ("filled" if name == "cn" else "recomputed"), result
        assert [lv["kind"] for lv in result["levels"]] == ["ram", "local", "pfs"], result["levels"]
        # which levels the plan fills follows the costs it measures (the machine's load): some file level
        assert result["recomputed_steps"] > 0 and any(
            lv["writes"] > 0 for lv in result["levels"] if lv["kind"] != "ram"), result
        hosts = rank_hosts(job_dir)
        assert sorted(hosts) == list(range(nodes)) and len(set(hosts.values())) == nodes, hosts
        want_info, want = local[name]
        got = read_gradients(tmp_path / f"{name}-job.h5")
        assert sorted(got) == sorted(want) == ["grad_k", "grad_u0"], (sorted(got), sorted(want))
        assert result["J"] == want_info["J"], (name, result["J"], want_info["J"])
        for field in want:
            assert abs(want[field]).max() > 0, field
            assert got[field].tobytes() == want[field].tobytes(), f"{name}: {field} differs from the local run"
    assert not any(cluster.local_dir.iterdir()), "node-local files leaked into the path outside the nodes"
