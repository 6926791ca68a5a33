"""A throw-away SLURM cluster for tests, one node or several on this machine: install, start, submit,
wait, stop.

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

Several nodes (``SlurmCluster(nodes=3)``, ``python tests/slurm_cluster.py --nodes 3``): one ``slurmd``
per node, ``node1`` .. ``nodeN``, each started under ``unshare --uts --mount`` so that it and every job
step it starts have their own host name and their own mount table. Inside node *k*:

- the host name is ``nodek`` and ``/etc/hosts`` (bind-mounted, private) maps ``nodeJ`` to 127.0.0.(J+1);
- :attr:`SlurmCluster.local_dir` (the same path on every node) is that node's private scratch: the
  node's own directory ``<base>/nodes/nodek/local`` is bind-mounted there, and ``<base>/nodes`` is
  then hidden under an empty tmpfs, so no node sees another's files (the test, outside every node,
  sees them all under :meth:`SlurmCluster.node_local`);
- with ``powercap=True``, a fake RAPL tree ``<base>/nodes/nodek/powercap`` is mounted over
  ``/sys/class/powercap`` (the path hpcadj's energy reader reads; where sysfs has no such directory,
  ``/sys/class`` is rebuilt on a tmpfs from bind mounts of its real entries plus ``powercap``);
- everything else (the test's directories, the venv, /tmp) is shared, as a parallel file system is.

Only loopback addresses are connected to: slurmctld on 127.0.0.1, each slurmd reached at its own
NodeAddr 127.0.0.(k+1) and its own port (``NodeName=... Port=``; why not ``NoInAddrAny``: see
``_write_conf``), srun's I/O and PMIx on 127.0.0.x, and :data:`LOOPBACK_MPI` makes OpenMPI's
out-of-band and TCP transports use ``lo`` only.

Usable outside pytest too: ``python tests/slurm_cluster.py [--nodes N]`` brings a cluster up, prints
the lines to evaluate (``export SLURM_CONF=...``; with several nodes also ``SLURM_TMPDIR`` and the
loopback ``OMPI_MCA_*``), and waits for Ctrl-C, which stops it and removes its directory (``--keep``
leaves the directory).
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


#: OpenMPI settings for jobs on a multi-node test cluster: between "nodes" the traffic goes over TCP
#: on the loopback interface only (out-of-band wire-up and the byte transfer layer alike); within one
#: node, shared memory (vader).
LOOPBACK_MPI = {"OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
                "OMPI_MCA_oob_tcp_if_include": "lo"}


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
    """munged + slurmctld + one slurmd per node, in a temporary directory, started and stopped by pid.

    ``nodes=1`` (default): this host is the node, as it is. ``nodes>1``: nodes ``node1`` .. ``nodeN``,
    each slurmd in its own UTS and mount namespace (see the module's docstring).
    """

    def __init__(self, base: str | os.PathLike | None = None, *, cpus: int | None = None,
                 partition: str = "debug", keep: bool = False, nodes: int = 1, powercap: bool = False):
        if nodes < 1 or nodes > 200:
            raise ValueError(f"nodes must be 1..200, not {nodes}")
        if powercap and nodes == 1:
            raise ValueError("powercap=True needs the per-node mount namespaces of nodes > 1")
        self.base = Path(tempfile.mkdtemp(prefix="hpcadj-slurm-", dir=base))
        self.cpus = cpus or max(os.cpu_count() or 1, 2)
        self.partition = partition
        self.keep = keep
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self.multinode = nodes > 1
        self.powercap = powercap
        #: node name -> loopback address its slurmd binds
        self.nodes = ({f"node{k}": f"127.0.0.{k + 1}" for k in range(1, nodes + 1)} if self.multinode
                      else {self.host: "127.0.0.1"})
        #: the node-local scratch directory as every node sees it (its own private copy on each)
        self.local_dir = self.base / "local"
        self._node_ns: dict[str, str] = {}  # node -> its UTS namespace (/proc/PID/ns/uts link)

    def node_dir(self, node: str) -> Path:
        """The test's (outside) view of a node's private files: local/, hosts, powercap/."""
        return self.base / "nodes" / node

    def node_local(self, node: str) -> Path:
        """What ``node`` sees at :attr:`local_dir`, read from outside (multi-node clusters)."""
        return self.node_dir(node) / "local"

    def node_powercap(self, node: str) -> Path:
        """The fake powercap tree mounted at /sys/class/powercap on ``node`` (``powercap=True``)."""
        return self.node_dir(node) / "powercap"

    def node_pids(self, node: str) -> list[int]:
        """Processes running in ``node``'s UTS namespace (its slurmd excluded): job steps and their tasks."""
        ns = self._node_ns.get(node)
        if ns is None:
            return []
        proc = self.procs.get(f"slurmd-{node}")
        daemon = proc.pid if proc is not None else -1
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != daemon:
                try:
                    if os.readlink(f"/proc/{entry}/ns/uts") == ns:
                        pids.append(int(entry))
                except OSError:
                    continue
        return sorted(pids)

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
        if not self.multinode:
            self._spawn("slurmd", [which("slurmd"), "-D", "-f", str(self.conf)])
        else:
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", self._node_argv(node))
        self._wait_for(lambda: all(self._node_ready(n) for n in self.nodes), timeout,
                       "the nodes did not become idle")
        if self.multinode:  # slurmd runs (it registered): unshare has made and entered its namespaces
            self._node_ns = {n: os.readlink(f"/proc/{self.procs[f'slurmd-{n}'].pid}/ns/uts") for n in self.nodes}

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
        names = [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in names:
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        # Whatever a job left behind on a node (a step's srun, a rank) lives in that node's namespace:
        # started by this cluster, so stopped here, by pid.
        for node in list(self._node_ns):
            for pid in self.node_pids(node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._node_ns = {}
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
        names = ["slurmctld.log", "slurmd.log", *(f"slurmd-{n}.log" for n in self.nodes),
                 *(f"slurmd-{n}.stdout" for n in self.nodes)]
        for name in names:
            path = self.base / "log" / name
            if path.exists() and path.stat().st_size:
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

    def node_state(self, node: str) -> str:
        try:
            proc = self.run(["scontrol", "show", "node", "-o", node], check=False, timeout=10)
        except subprocess.TimeoutExpired:
            return ""
        return parse_record(proc.stdout).get("State", "") if proc.returncode == 0 else ""

    def kill_node(self, node: str, timeout: float = 30) -> None:
        """A node is lost: SIGKILL its slurmd and every process in its namespace (job steps, ranks).

        slurmctld is told at once (``scontrol update State=DOWN``) instead of waiting SlurmdTimeout.
        """
        proc = self.procs.pop(f"slurmd-{node}")
        proc.kill()
        proc.wait(timeout=timeout)
        for pid in self.node_pids(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=killed by the test"])

    def restart_node(self, node: str, timeout: float = 60) -> None:
        """Bring a node killed by :meth:`kill_node` back: a new slurmd in new namespaces, node resumed."""
        if f"slurmd-{node}" in self.procs:
            return
        self._spawn(f"slurmd-{node}", self._node_argv(node))
        self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        self._wait_for(lambda: self._node_ready(node), timeout, f"{node} did not come back")
        self._node_ns[node] = os.readlink(f"/proc/{self.procs[f'slurmd-{node}'].pid}/ns/uts")

    def _node_ready(self, node: str | None = None) -> bool:
        node = node or self.host
        try:
            proc = self.run(["scontrol", "show", "node", "-o", node], check=False, timeout=10)
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

    def _node_argv(self, node: str) -> list[str]:
        """slurmd for ``node`` in new UTS and mount namespaces, after its private mounts (see the module doc).

        unshare execs the shell, which execs slurmd: the pid Popen knows is slurmd's own.
        """
        nd = self.node_dir(node)
        nodes_root = self.base / "nodes"
        script = ["set -eu", 'hostname "$NODE"', 'mount --bind "$ND/hosts" /etc/hosts',
                  'mount --bind "$ND/local" "$LOCAL"']
        if self.powercap:
            script += [
                'if [ -d /sys/class/powercap ]; then mount --bind "$ND/powercap" /sys/class/powercap; else',
                # sysfs has no powercap directory to mount over: rebuild /sys/class on a tmpfs from bind
                # mounts of its real entries (their ../../devices links resolve as before), plus ours.
                '  stash="$ND/sysclass"; mkdir -p "$stash"; mount --bind /sys/class "$stash"',
                '  mount -t tmpfs -o mode=0755 sysclass /sys/class',
                '  for e in "$stash"/*; do n=${e##*/}; mkdir "/sys/class/$n"; mount --bind "$e" "/sys/class/$n"; done',
                '  mkdir /sys/class/powercap; mount --bind "$ND/powercap" /sys/class/powercap',
                '  umount -l "$stash"',
                'fi']
        # Hide every node's private directory (this one's included: it is mounted where it belongs).
        script += ['mount -t tmpfs -o size=1m,mode=0755 hidden "$NODES"',
                   'exec "$SLURMD" -D -N "$NODE" -f "$CONF"']
        return ["env", f"NODE={node}", f"ND={nd}", f"LOCAL={self.local_dir}", f"NODES={nodes_root}",
                f"SLURMD={which('slurmd')}", f"CONF={self.conf}",
                which("unshare"), "--uts", "--mount", "--propagation", "private",
                "/bin/sh", "-c", "\n".join(script)]

    def _write_nodes(self) -> None:
        """Per-node directories (outside view): local scratch, /etc/hosts, the fake powercap tree."""
        self.local_dir.mkdir(exist_ok=True)
        hosts = ["127.0.0.1 localhost", f"127.0.0.1 {self.host}",
                 *(f"{addr} {node}" for node, addr in self.nodes.items())]
        for k, node in enumerate(self.nodes, start=1):
            nd = self.node_dir(node)
            (nd / "local").mkdir(parents=True)
            (nd / "hosts").write_text("\n".join(hosts) + "\n")
            if self.powercap:
                zone = nd / "powercap" / "intel-rapl:0"
                zone.mkdir(parents=True)
                (zone / "name").write_text("package-0\n")
                (zone / "energy_uj").write_text(f"{k * 1000000}\n")
                (zone / "max_energy_range_uj").write_text("262143328850\n")

    def _node_lines(self) -> str:
        if not self.multinode:
            return f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 State=UNKNOWN"
        return "\n".join(f"NodeName={node} NodeAddr={addr} NodeHostname={node} Port={self._node_ports[node]} "
                         f"CPUs={self.cpus} "
                         f"RealMemory=4000 State=UNKNOWN" for node, addr in self.nodes.items())

    def _write_conf(self) -> None:
        b = self.base
        for d in ("state", "spool", "log", "run"):
            (b / d).mkdir(exist_ok=True)
        ctld_port, slurmd_port, *node_ports = free_ports(2 + len(self.nodes))
        self._node_ports = dict(zip(self.nodes, node_ports))
        if self.multinode:
            self._write_nodes()
            # One slurmd per node on this machine, each on its own port (NodeName ... Port=): %n (the
            # node name) keeps their spool, pid and log files apart.
            #
            # Not CommunicationParameters=NoInAddrAny (each slurmd bound to its NodeAddr on one shared
            # port): it applies to srun as well, which then listens on the address its host name
            # resolves to, 127.0.0.(k+1), while slurmstepd connects back to the source address of
            # srun's connections, which on lo is 127.0.0.1 ("Slurmd could not connect IO"); and slurmd
            # overrides the job's SLURM_CONF with its own, so clients cannot be given another file.
            slurmd_files = f"""\
# The node-local file system: slurmd reports its size, and srun --mpi=pmix puts its per-step client
# directories there (in the default /tmp, shared by the nodes here, the steps of nodes collide).
TmpFS={self.local_dir}
SlurmdSpoolDir={b / 'spool' / '%n'}
SlurmdPidFile={b / 'run' / 'slurmd-%n.pid'}
SlurmdLogFile={b / 'log' / 'slurmd-%n.log'}"""
            for node in self.nodes:
                (b / "spool" / node).mkdir(exist_ok=True)
        else:
            slurmd_files = f"""\
SlurmdSpoolDir={b / 'spool'}
SlurmdPidFile={b / 'run' / 'slurmd.pid'}
SlurmdLogFile={b / 'log' / 'slurmd.log'}"""
        what = f"{len(self.nodes)}-node" if self.multinode else "single-node"
        conf = f"""\
# Written by tests/slurm_cluster.py: a private {what} cluster in {b}.
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
SlurmctldPidFile={b / 'run' / 'slurmctld.pid'}
SlurmctldLogFile={b / 'log' / 'slurmctld.log'}
{slurmd_files}
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
{self._node_lines()}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        self.conf.write_text(conf)


def main(argv: list[str] | None = None) -> int:
    """``python tests/slurm_cluster.py``: start a cluster, print the shell lines to evaluate (every
    ``export`` on a line of its own, comments apart), wait for Ctrl-C or SIGTERM, stop it and remove
    its directory (unless ``--keep``)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Start a private SLURM cluster; Ctrl-C stops it.")
    parser.add_argument("--nodes", type=int, default=1,
                        help="slurmd daemons, one per node in its own UTS and mount namespace when > 1")
    parser.add_argument("--powercap", action="store_true",
                        help="mount a fake RAPL tree over /sys/class/powercap on every node (--nodes > 1)")
    parser.add_argument("--keep", action="store_true",
                        help="leave the cluster's directory (configuration, logs, state) after the stop")
    cli = parser.parse_args(argv)
    # Stop cleanly on SIGTERM and SIGINT (a background job of a script ignores SIGINT otherwise).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with SlurmCluster(keep=cli.keep, nodes=cli.nodes, powercap=cli.powercap) as cluster:
        print(f"export SLURM_CONF={cluster.conf}", flush=True)
        if cluster.multinode:
            print(f"# nodes: {' '.join(f'{n}={a}' for n, a in cluster.nodes.items())}\n"
                  f"# node-local scratch, private per node (from outside under {cluster.base / 'nodes'}/<node>/local):\n"
                  f"export SLURM_TMPDIR={cluster.local_dir}\n"
                  f"# MPI over loopback only:", flush=True)
            for k, v in LOOPBACK_MPI.items():
                print(f"export {k}={v}", flush=True)
        print(f"# Ctrl-C stops the cluster{'' if cli.keep else f' and removes {cluster.base}'}", flush=True)
        try:
            signal.pause()
        except (KeyboardInterrupt, SystemExit):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
