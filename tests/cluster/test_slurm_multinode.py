"""jobs/*.sbatch on a private 3-node SLURM cluster on this machine (tests/slurm_cluster.py, nodes=3).

Each node is a slurmd in its own UTS and mount namespace: its own host name (node1..node3), its own
node-local scratch (the same path, different files on each node), its own fake RAPL tree at
/sys/class/powercap; the test's directory plays the shared parallel file system. Daemons and MPI
talk over loopback only (slurm_cluster.LOOPBACK_MPI: OpenMPI's TCP transport on `lo` between nodes).

Checked here: a three-level gradient across 3 nodes x 2 ranks keeps each rank's node-local files on
its own node and is bitwise equal to the same ranks on one node; both launchers (mpirun, srun
--mpi=pmix) across nodes; a node lost in the adjoint sweep, resumed on the two others from the HDF5
level and the run directory; one energy reader per node, the job's energy the sum over nodes; the
scaling script's series across the nodes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest

from ..helpers import ROOT, assert_jobs_completed, batch_output, rank_hosts, slurm_cluster, slurm_job_env
from ..slurm_cluster import LOOPBACK_MPI, SlurmCluster

# A few minutes on a 2-core machine: `make test-cluster` (and .ci/run) runs it, `make test` does not.
pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(os.environ.get("HPCADJ_TEST_CLUSTER") != "1",
                                 reason="multi-node SLURM tests: run with `make test-cluster` (HPCADJ_TEST_CLUSTER=1)")]

JOBS = ROOT / "jobs"
WAIT = 180  # seconds for one job on a busy 2-core machine
NODES = ["node1", "node2", "node3"]


@pytest.fixture(scope="module")
def cluster():
    # 6 CPUs a node: a one-node run may have the 6 ranks of the 3-node one (all oversubscribed anyway).
    yield from slurm_cluster(nodes=3, cpus=6, powercap=True)


def job_env(cluster: SlurmCluster, submit_dir: Path, **extra) -> dict:
    return slurm_job_env(submit_dir, {"SLURM_TMPDIR": str(cluster.local_dir), **LOOPBACK_MPI},
                         keep=("SLURM_TMPDIR",), **extra)


def completed(cluster, job: str, submit_dir: Path, timeout: float = WAIT) -> None:
    assert_jobs_completed(cluster, job, submit_dir, timeout, log_lines=30)


def gradient(path: Path) -> dict:
    """The gradient fields of a --gradient-out file (h5py's MPI build, as every later test needs)."""
    import numpy as np

    from hpcadj.imports import h5py

    with h5py().File(path, "r") as f:
        return {name: np.array(f[name]) for name in f if name.startswith("grad_")}


def test_gradient_on_three_nodes_node_local_files_and_bitwise(cluster, tmp_path):
    """3 nodes x 2 ranks (mpirun), RAM + node-local + HDF5: every rank's node-local files on its own node
    only; the gradient bitwise equal to the same 6 ranks on one node."""
    sizes = dict(HPCADJ_GRID="32x32", HPCADJ_STEPS=24, HPCADJ_RAM=2, HPCADJ_DISK=2, HPCADJ_PFS=16)
    env = job_env(cluster, tmp_path, **sizes,
                  HPCADJ_EXTRA_ARGS=f"--keep-checkpoints --gradient-out {tmp_path / 'grad-3nodes.h5'}")
    job = cluster.sbatch(["--nodes=3", "--ntasks=6", "--ntasks-per-node=2", str(JOBS / "gradient.sbatch")],
                         env=env, cwd=tmp_path)
    env1 = job_env(cluster, tmp_path, **sizes, HPCADJ_EXTRA_ARGS=f"--gradient-out {tmp_path / 'grad-1node.h5'}")
    job1 = cluster.sbatch(["--nodes=1", "--ntasks=6", str(JOBS / "gradient.sbatch")], env=env1, cwd=tmp_path)
    completed(cluster, job, tmp_path)
    completed(cluster, job1, tmp_path)

    job_dir = tmp_path / "hpcadj-jobs" / f"gradient-{job}"
    result = json.loads((job_dir / "result.json").read_text())
    assert result["ranks"] == 6 and [lv["kind"] for lv in result["levels"]] == ["ram", "local", "pfs"]
    local = next(lv for lv in result["levels"] if lv["kind"] == "local")
    assert local["writes"] > 0, result["levels"]
    assert (job_dir / "checkpoints.h5").is_file(), "the HDF5 level's file is not on the shared file system"
    hosts = rank_hosts(job_dir)
    assert sorted(hosts) == list(range(6)) and sorted(set(hosts.values())) == NODES, hosts
    assert all(list(hosts.values()).count(n) == 2 for n in NODES), hosts
    # The node-local level's per-rank directories: each on its rank's node, on no other.
    for node in NODES:
        found = {int(p.name[4:]) for p in cluster.node_local(node).glob(f"hpcadj-{job}/*/*/rank*")}
        assert found == {r for r, h in hosts.items() if h == node}, (node, found, hosts)
    assert not any(cluster.local_dir.iterdir()), "node-local files leaked into the path outside the nodes"

    one = json.loads((tmp_path / "hpcadj-jobs" / f"gradient-{job1}" / "result.json").read_text())
    assert set(rank_hosts(tmp_path / "hpcadj-jobs" / f"gradient-{job1}").values()) == {"node1"}
    assert one["J"] == result["J"], (one["J"], result["J"])
    g3, g1 = gradient(tmp_path / "grad-3nodes.h5"), gradient(tmp_path / "grad-1node.h5")
    assert sorted(g3) == sorted(g1) and g3
    for name in g3:
        assert g3[name].tobytes() == g1[name].tobytes(), f"{name} differs between 3 nodes and 1 node"


def test_srun_pmix_across_nodes(cluster, tmp_path):
    """HPCADJ_LAUNCHER=srun (--mpi=pmix): direct launch of 3 ranks on 3 nodes."""
    plugins = cluster.run(["srun", "--mpi=list"], check=False)
    if "pmix" not in plugins.stdout + plugins.stderr:
        pytest.skip("this SLURM has no pmix MPI plugin (srun --mpi=list)")
    env = job_env(cluster, tmp_path, HPCADJ_LAUNCHER="srun", HPCADJ_GRID="32x32", HPCADJ_STEPS=12,
                  HPCADJ_RAM=2, HPCADJ_DISK=2, HPCADJ_PFS=8)
    job = cluster.sbatch(["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", str(JOBS / "gradient.sbatch")],
                         env=env, cwd=tmp_path)
    completed(cluster, job, tmp_path)
    job_dir = tmp_path / "hpcadj-jobs" / f"gradient-{job}"
    assert rank_hosts(job_dir) == {0: "node1", 1: "node2", 2: "node3"}
    assert "srun --ntasks=3 --mpi=pmix" in (job_dir / "history.log").read_text()


def test_scaling_series_across_nodes(cluster, tmp_path):
    """jobs/scaling.sbatch on 3 nodes x 1 rank: strong and weak series of 1, 2, 3 ranks; the 3-rank
    points span the three nodes."""
    env = job_env(cluster, tmp_path, HPCADJ_GRID="24x24", HPCADJ_WEAK_GRID="16x16", HPCADJ_STEPS=8)
    job = cluster.sbatch(["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", str(JOBS / "scaling.sbatch")],
                         env=env, cwd=tmp_path)
    completed(cluster, job, tmp_path, timeout=2 * WAIT)
    job_dir = tmp_path / "hpcadj-jobs" / f"scaling-{job}"
    assert (job_dir / "COMPLETE").is_file()
    for series in ("strong", "weak"):
        for p in (1, 2, 3):
            run = job_dir / f"{series}-p{p}"
            assert (run / "COMPLETE").is_file(), f"{run} not complete\n{batch_output(tmp_path)}"
            assert json.loads((run / "result.json").read_text())["ranks"] == p
        assert sorted(set(rank_hosts(job_dir / f"{series}-p3").values())) == NODES


def wait_for_phase(cluster, job: str, log: Path, phase: str, submit_dir: Path) -> None:
    deadline = time.monotonic() + WAIT
    while not (log.is_file() and f'"phase": "{phase}"' in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"no {phase} event in {log}\n{batch_output(submit_dir)}"
        assert cluster.state(job) in ("PENDING", "RUNNING", "CONFIGURING"), batch_output(submit_dir)
        time.sleep(0.2)


def test_node_lost_in_the_adjoint_sweep_resumes_on_the_others(cluster, tmp_path):
    """3 nodes x 1 rank; in the adjoint sweep node3 is lost (every process on it SIGKILLed, its scratch
    wiped, its slurmd gone, the node DOWN). SLURM requeues the job (--requeue, node failure), which then
    waits for three nodes; it is cancelled and resubmitted into the same folder (HPCADJ_JOB_FOLDER) on
    the two remaining nodes (2 ranks), resumes from the HDF5 level and the run directory and ends with
    the uninterrupted run's gradient."""
    sizes = dict(HPCADJ_GRID="32x32", HPCADJ_STEPS=400, HPCADJ_RAM=4, HPCADJ_DISK=8, HPCADJ_PFS=16)
    durable = "--durable-interval 0.5"
    env = job_env(cluster, tmp_path, **sizes, HPCADJ_EXTRA_ARGS=f"{durable} --gradient-out {tmp_path / 'ref.h5'}")
    ref = cluster.sbatch(["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", str(JOBS / "gradient.sbatch")],
                         env=env, cwd=tmp_path)
    completed(cluster, ref, tmp_path, timeout=2 * WAIT)

    env = job_env(cluster, tmp_path, **sizes, HPCADJ_EXTRA_ARGS=f"{durable} --gradient-out {tmp_path / 'got.h5'}")
    job = cluster.sbatch(["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", str(JOBS / "gradient.sbatch")],
                         env=env, cwd=tmp_path)
    job_dir = tmp_path / "hpcadj-jobs" / f"gradient-{job}"
    wait_for_phase(cluster, job, job_dir / "rank00002.jsonl", "adjoint", tmp_path)
    assert rank_hosts(job_dir)[2] == "node3"
    time.sleep(1.0)  # well into the sweep: some adjoint states are durable
    try:
        cluster.kill_node("node3")
        shutil.rmtree(cluster.node_local("node3"))
        cluster.node_local("node3").mkdir()
        (record,) = cluster.wait_until(
            job, lambda r: r[0]["JobState"] in ("FAILED", "NODE_FAIL", "CANCELLED")
            or (r[0]["JobState"] == "PENDING" and int(r[0].get("Restarts", "0")) >= 1), WAIT, "requeue or end")
        time.sleep(1)  # the killed attempt's batch shell writes its marker within KillWait
        assert (job_dir / "FAILED").is_file() or (job_dir / "STOPPED").is_file(), batch_output(tmp_path)
        assert not (job_dir / "COMPLETE").exists()
        assert list((job_dir / "state").glob("adjoint-*.h5")), "no durable adjoint state before the loss"
        if record["JobState"] == "PENDING":
            # Requeued by SLURM, waiting for a third node. Resized in place (scontrol update NumNodes=2
            # NumTasks=2) it would start on 2 nodes but with the submission's SLURM_NTASKS=3: resubmit.
            cluster.run(["scancel", job])
            cluster.wait(job, WAIT)
        env["HPCADJ_JOB_FOLDER"] = str(job_dir)
        again = cluster.sbatch(["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--exclude=node3",
                                str(JOBS / "gradient.sbatch")], env=env, cwd=tmp_path)
        completed(cluster, again, tmp_path, timeout=2 * WAIT)
    finally:
        cluster.restart_node("node3")
    result = json.loads((job_dir / "result.json").read_text())
    assert result["ranks"] == 2 and result.get("resumed"), result
    history = (job_dir / "history.log").read_text()
    assert "resume=1" in history and "--resume" in history, history
    assert set(rank_hosts(job_dir).values()) == {"node1", "node2"}
    want, got = gradient(tmp_path / "ref.h5"), gradient(tmp_path / "got.h5")
    assert sorted(want) == sorted(got) and want
    for name in want:
        diff = abs(want[name] - got[name]).max()
        assert diff <= 1e-10 * max(1.0, abs(want[name]).max()), (name, diff)


# -- one energy reader per node -----------------------------------------------------------------
IN_OPEN = 0x20


class OpenCounter:
    """Counts opens of ``energy_uj`` in each node's fake powercap zone (inotify on the host's view)."""

    def __init__(self, dirs: dict[str, Path]):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.wd = {}
        for node, path in dirs.items():
            wd = libc.inotify_add_watch(self.fd, str(path).encode(), IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            self.wd[wd] = node
        self.counts = {node: 0 for node in dirs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            if not select.select([self.fd], [], [], 0.1)[0]:
                continue
            data = os.read(self.fd, 65536)
            while data:
                wd, mask, _cookie, length = struct.unpack_from("iIII", data)
                name = data[16:16 + length].rstrip(b"\0").decode()
                if mask & IN_OPEN and name == "energy_uj":
                    self.counts[self.wd[wd]] += 1
                data = data[16 + length:]

    def close(self):
        self._stop.set()
        self._thread.join()
        os.close(self.fd)


def test_one_energy_reader_per_node(cluster, tmp_path):
    """3 nodes x 2 ranks; each node's fake RAPL counter advances at its own rate (node k: k watts).
    Exactly one rank per node opens energy_uj (at the start and at the end of the run, no sampling
    within 30 s), and the job's measured energy is the sum of the three nodes' figures."""
    zones = {node: cluster.node_powercap(node) / "intel-rapl:0" for node in NODES}
    stop = threading.Event()

    def advance():  # atomic replace: a reader never sees a half-written counter
        t0 = time.monotonic()
        while not stop.is_set():
            dt = time.monotonic() - t0
            for k, (node, zone) in enumerate(zones.items(), start=1):
                tmp = zone / ".energy_uj.tmp"
                tmp.write_text(f"{1_000_000 + int(k * 1e6 * dt)}\n")
                os.replace(tmp, zone / "energy_uj")
            time.sleep(0.02)

    writer = threading.Thread(target=advance, daemon=True)
    writer.start()
    counter = OpenCounter(zones)
    try:
        env = job_env(cluster, tmp_path, HPCADJ_GRID="32x32", HPCADJ_STEPS=60, HPCADJ_RAM="", HPCADJ_DISK="",
                      HPCADJ_PFS="")
        job = cluster.sbatch(["--nodes=3", "--ntasks=6", "--ntasks-per-node=2", str(JOBS / "gradient.sbatch")],
                             env=env, cwd=tmp_path)
        completed(cluster, job, tmp_path)
        time.sleep(0.3)  # the last inotify events
    finally:
        counter.close()
        stop.set()
        writer.join()
    job_dir = tmp_path / "hpcadj-jobs" / f"gradient-{job}"
    summary = json.loads((job_dir / "summary.json").read_text())
    rapl = summary["energy"]["measured"]["rapl"]
    assert rapl["source"] == "rapl", rapl
    assert sorted(rapl["nodes"]) == NODES, rapl
    per_node = {node: zones_["package-0"] for node, zones_ in rapl["nodes"].items()}
    assert all(j > 0 for j in per_node.values()), per_node
    assert rapl["joules"] == pytest.approx(sum(per_node.values()), rel=1e-12)
    assert summary["energy"]["total"]["joules"] == pytest.approx(rapl["joules"], rel=1e-12)
    # node k's counter runs at k watts over the same interval: the figures are in ratio 1 : 2 : 3
    assert per_node["node2"] / per_node["node1"] == pytest.approx(2, rel=0.35), per_node
    assert per_node["node3"] / per_node["node1"] == pytest.approx(3, rel=0.35), per_node
    wall = summary["wall_seconds"]
    extra = int(wall // 30)  # the reader's sampling thread (every 30 s) in a run that long
    for node, opens in counter.counts.items():
        assert 2 <= opens <= 2 + extra, (f"{node}: energy_uj opened {opens} times in a {wall:.1f} s run: "
                                         f"not one reader", counter.counts)
