"""A throw-away single-node SLURM cluster for tests: install, start, submit, wait, stop.

``SlurmCluster`` installs Debian's ``slurmctld slurmd munge slurm-client`` when they are missing (as
root, with apt-get), writes a munge key and a single-node ``slurm.conf`` into a temporary directory,
and runs its own ``munged``, ``slurmctld`` and ``slurmd`` in the foreground as child processes, so
it knows their pids and stops exactly those. Everything it uses is private to that directory: its
own munge socket, free TCP ports, state and spool directories. A cluster already running on the
machine (with /etc/slurm, the default ports and /run/munge) is not touched.

Client commands (``sbatch``, ``scontrol``, ``scancel``, ``srun``) reach this cluster through
``SLURM_CONF``; :meth:`env` returns an environment that has it.

    with SlurmCluster() as cluster:
        job = cluster.sbatch(["jobs/gradient.sbatch"], env={...})
        info = cluster.wait(job, timeout=60)

Usable outside pytest too: ``python tests/slurm_cluster.py`` brings a cluster up, prints the
``SLURM_CONF`` to export, and waits for Ctrl-C.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# libpmix-dev: SLURM's mpi/pmix plugin dlopens the unversioned libpmix.so, which only it provides
PACKAGES = ["slurmctld", "slurmd", "munge", "slurm-client", "libpmix-dev"]
PROGRAMS = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "srun"]
#: JobState values after which a job does not run again by itself (REQUEUED / PENDING do).
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be installed or started on this machine (the reason is the message)."""


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None
            and not any(os.access(os.path.join(d, p), os.X_OK) for d in ("/usr/sbin", "/sbin"))]


def which(program: str) -> str:
    found = shutil.which(program)
    for d in ("/usr/sbin", "/sbin"):  # daemons live in sbin, which a non-login PATH may lack
        if found is None and os.access(os.path.join(d, program), os.X_OK):
            found = os.path.join(d, program)
    if found is None:
        raise SlurmUnavailable(f"{program} not found")
    return found


def missing_packages() -> list[str]:
    """PACKAGES that dpkg does not list as installed (none where there is no dpkg)."""
    if shutil.which("dpkg-query") is None:
        return []
    return [p for p in PACKAGES if "install ok installed" not in subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True).stdout]


def ensure_installed(timeout: float = 600) -> None:
    """Install Debian's SLURM, munge and PMIx packages when one is missing; SlurmUnavailable if not possible."""
    missing = missing_programs() + missing_packages()
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"SLURM programs missing ({', '.join(missing)}) and not root to apt-get install them")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"SLURM programs missing ({', '.join(missing)}) and no apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:  # a stale package list is the usual cause: refresh once and retry
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=timeout)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} failed (rc {proc.returncode}): "
                               + " | ".join(tail))
    still = missing_programs()
    if still:
        raise SlurmUnavailable(f"still missing after apt-get install: {', '.join(still)}")


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free right now (held open together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol show -o`` record: ``Key=Value`` pairs separated by spaces (values may hold '=')."""
    fields: dict[str, str] = {}
    for match in re.finditer(r"(\S+?)=(\S*)", line):
        fields.setdefault(match.group(1), match.group(2))
    return fields


class SlurmCluster:
    """munged + slurmctld + slurmd for this host, in a temporary directory, started and stopped by pid."""

    def __init__(self, base: str | os.PathLike | None = None, *, cpus: int | None = None,
                 partition: str = "debug", keep: bool = False):
        self.base = Path(tempfile.mkdtemp(prefix="hpcadj-slurm-", dir=base))
        self.cpus = cpus or max(os.cpu_count() or 1, 2)
        self.partition = partition
        self.keep = keep
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}

    # -- life cycle -------------------------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self, extra: dict | None = None) -> dict:
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        # A test process may itself run under a SLURM job: its job variables must not leak into sbatch.
        for key in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if key != "SLURM_CONF":
                del env[key]
        if extra:
            env.update(extra)
        return env

    def start(self, timeout: float = 60) -> None:
        ensure_installed()
        self._write_munge()
        self._spawn("munged", [which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={self.base / 'munge' / 'munge.key'}",
                               f"--pid-file={self.base / 'munge' / 'munged.pid'}",
                               f"--log-file={self.base / 'munge' / 'munged.log'}",
                               f"--seed-file={self.base / 'munge' / 'munged.seed'}"])
        self._wait_for(lambda: self.munge_socket.exists(), 15, "munged did not create its socket")
        self._write_conf()
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-c", "-f", str(self.conf)])
        self._wait_for(lambda: self._scontrol_ok(["ping"]), timeout, "slurmctld does not answer scontrol ping")
        self._spawn("slurmd", [which("slurmd"), "-D", "-f", str(self.conf)])
        self._wait_for(self._node_ready, timeout, "the node did not become idle")

    def stop(self, timeout: float = 30) -> None:
        """Cancel this cluster's jobs, then stop slurmd, slurmctld and munged by their pids."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                ids = sorted({r.get("JobId") for r in self.jobs() if r.get("JobId")})
                if ids:
                    subprocess.run([which("scancel"), *ids], env=self.env(), capture_output=True, timeout=15)
                    # Job steps (slurmstepd) outlive slurmd: let them finish before slurmd goes.
                    self._wait_for(lambda: all(r.get("JobState") in FINAL_STATES for r in self.jobs()),
                                   timeout, None)
            except (OSError, subprocess.SubprocessError, SlurmUnavailable):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for fh in getattr(self, "_logs", []):
            fh.close()
        self._logs = []
        if not self.keep:
            shutil.rmtree(self.base, ignore_errors=True)

    # -- client commands --------------------------------------------------------------------------
    def run(self, argv: list[str], *, env: dict | None = None, timeout: float = 30,
            check: bool = True, cwd=None) -> subprocess.CompletedProcess:
        argv = [which(argv[0]), *argv[1:]]
        proc = subprocess.run(argv, env=self.env(env), capture_output=True, text=True, timeout=timeout,
                              cwd=cwd)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def sbatch(self, args: list[str], *, env: dict | None = None, cwd=None) -> str:
        """Submit with ``sbatch --parsable``; returns the job id (the array's id for a job array)."""
        out = self.run(["sbatch", "--parsable", *args], env=env, cwd=cwd).stdout.strip()
        return out.split(";")[0].splitlines()[-1]

    def jobs(self, job: str | None = None) -> list[dict[str, str]]:
        """``scontrol show job -o`` records (all tasks of an array), [] when the job is unknown."""
        argv = ["scontrol", "show", "job", "-o"] + ([job] if job else [])
        proc = self.run(argv, check=False)
        if proc.returncode != 0:
            return []
        return [parse_record(line) for line in proc.stdout.splitlines() if "JobId=" in line]

    def wait_until(self, job: str, predicate, timeout: float = 120, what: str = "condition"):
        """Poll ``scontrol show job`` until ``predicate(records)`` is true; returns the records."""
        deadline = time.monotonic() + timeout
        records: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            records = self.jobs(job)
            if records and predicate(records):
                return records
            self.check_daemons()
            time.sleep(0.25)
        summary = "; ".join(f"{r.get('JobId')} {r.get('JobState')} {r.get('Reason')}" for r in records)
        raise TimeoutError(f"job {job}: {what} not reached after {timeout} s: {summary}\n{self.log_tails()}")

    def state(self, job: str) -> str | None:
        records = self.jobs(job)
        return records[0].get("JobState") if records else None

    def wait(self, job: str, timeout: float = 120, states=FINAL_STATES) -> list[dict[str, str]]:
        """Wait until every record of ``job`` (each array task) is in ``states``; TimeoutError with the
        records and daemon log tails otherwise."""
        return self.wait_until(job, lambda records: all(r.get("JobState") in states for r in records),
                               timeout, f"every task in {sorted(states)}")

    def check_daemons(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"SLURM daemons exited: {dead}\n{self.log_tails()}")

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.base / "log" / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name} (last {lines} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- internals --------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        (self.base / "log").mkdir(exist_ok=True)
        if not hasattr(self, "_logs"):
            self._logs = []
        out = open(self.base / "log" / f"{name}.stdout", "w")
        self._logs.append(out)
        # A new session: a Ctrl-C at the test's terminal must not reach the daemons before stop() does.
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                            start_new_session=True, stdin=subprocess.DEVNULL)

    def _wait_for(self, predicate, timeout: float, message: str | None) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            if message is not None:
                self.check_daemons()
            time.sleep(0.25)
        if message is None:
            return False
        # Installed but not starting is a failure to report, not a reason to skip.
        raise RuntimeError(f"{message} within {timeout} s\n{self.log_tails()}")

    def _scontrol_ok(self, args: list[str]) -> bool:
        try:
            return self.run(["scontrol", *args], check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _node_ready(self) -> bool:
        try:
            proc = self.run(["scontrol", "show", "node", "-o", self.host], check=False, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        state = parse_record(proc.stdout).get("State", "") if proc.returncode == 0 else ""
        return state.startswith(("IDLE", "MIXED", "ALLOCATED"))

    def _write_munge(self) -> None:
        mdir = self.base / "munge"
        mdir.mkdir(mode=0o700)
        key = mdir / "munge.key"
        # A fresh random key: this cluster's credentials mean nothing to any other munged.
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def _write_conf(self) -> None:
        b = self.base
        for d in ("state", "spool", "log", "run"):
            (b / d).mkdir(exist_ok=True)
        ctld_port, slurmd_port = free_ports(2)
        conf = f"""\
# Written by tests/slurm_cluster.py: a private single-node cluster in {b}.
ClusterName=hpcadjtest
# Loopback addresses: the test needs no DNS or /etc/hosts entry for this host name.
SlurmctldHost={self.host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
# cred_expire (default 120 s) is also how long a requeued job is held before it may start again
# (slurmd refuses the new launch while the old credential is revoked): short, so tests can requeue.
AuthInfo=socket={self.munge_socket},cred_expire=10
CredType=cred/munge
StateSaveLocation={b / 'state'}
SlurmdSpoolDir={b / 'spool'}
SlurmctldPidFile={b / 'run' / 'slurmctld.pid'}
SlurmdPidFile={b / 'run' / 'slurmd.pid'}
SlurmctldLogFile={b / 'log' / 'slurmctld.log'}
SlurmdLogFile={b / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: works in containers and VMs without cgroup delegation.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
# Finished jobs stay visible to 'scontrol show job' long enough for the test to read them.
MinJobAge=600
KillWait=5
InactiveLimit=0
# At least 2 CPUs even on a 1-core machine, so 2-rank jobs can be scheduled.
SlurmdParameters=config_overrides
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 State=UNKNOWN
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        self.conf.write_text(conf)


if __name__ == "__main__":
    import sys

    # Stop cleanly on SIGTERM and SIGINT (a background job of a script ignores SIGINT otherwise).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with SlurmCluster(keep=True) as cluster:
        print(f"export SLURM_CONF={cluster.conf}\n# Ctrl-C stops the cluster", flush=True)
        try:
            signal.pause()
        except (KeyboardInterrupt, SystemExit):
            pass
