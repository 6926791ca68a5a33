"""Every command shown in README.md, docs/*.md, jobs/README.md and experiments/**/README.md runs, at
small sizes with the same flags, so a documented command cannot rot (docs/architecture.md, pitfalls:
argparse once swallowed the README's own ``-heat_ksp_type gmres``).

What counts as a documented command: every line of a fenced ``sh``/``bash`` block, every line of an
unlabelled fenced block that starts with a command (``hpcadj``, ``mpirun``, ``make``, ``python``,
...), and every inline code span that starts with one and is more than a subcommand's name (spans
with placeholders such as ``...``, ``<name>``, ``[--json]``, ``DIR`` or ``JOBID`` are prose and
skipped, except where RUN lists them). Each one is either in RUN (how it is run here: the same
command with grids and step counts made small, paths moved into a temporary directory) or in
NOT_RUN with the reason; a command in neither fails the test, and so does an entry that no longer
matches any document. The commands of one document run in document order in one temporary working
directory (so ``hpcadj calibrate --out burgers.json`` feeds the next ``--costs burgers.json``), each
with a timeout. docs/example.md's plug-in recipe (a model declared under the ``hpcadj.models`` entry
point) runs from a ``.dist-info`` directory, as an installed package would provide it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from ..helpers import ROOT, mpi_env, run
from ..unit.test_doc_links import DOCS

COMMAND_WORDS = {"hpcadj", "mpirun", "make", "python", "python3", "sbatch", "srun", "bash", "pip", "module",
                 "scancel", "scontrol", ".", "export", ".venv/bin/python", ".venv/bin/hpcadj"}
SHELL_FENCES = {"sh", "bash", "shell", "console"}
PLACEHOLDER = re.compile(r"\.\.\.|<[a-z-]+>|\[|\||\b(DIR|JOBID|LOG_DIR|FILE|R)\b")
TIMEOUT = 60
#: 2-D grids become 16x16, 3-D ones 8x8x8; step counts at most 12
SMALL_GRID = {2: "16x16", 3: "8x8x8"}
MAX_STEPS = 12


# -- what the documents show -----------------------------------------------------------------------
def _first_word(cmd: str) -> str:
    cmd = re.sub(r'^([A-Z_][A-Z0-9_]*=("[^"]*"|\S*) )+', "", cmd)  # VAR=value prefixes
    return cmd.split()[0] if cmd.split() else ""


def fenced_commands(text: str) -> list[str]:
    """Shell lines of the fenced blocks, backslash continuations joined, trailing comments dropped."""
    out = []
    for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, flags=re.S | re.M):
        lang, body = m.group(1).strip(), re.sub(r"\\\n\s*", " ", m.group(2))
        lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        # an unlabelled block is commands when it starts with one (not a command's printed output)
        if lang in SHELL_FENCES or (not lang and lines and _first_word(lines[0]) in COMMAND_WORDS):
            out += [re.sub(r"\s+", " ", line) for line in lines]
    return out


def inline_commands(text: str) -> list[str]:
    """Inline code spans that are whole commands (not a subcommand's name, no placeholder)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        span = span.strip()
        if (_first_word(span) not in COMMAND_WORDS or len(span.split()) < 2 or PLACEHOLDER.search(span)
                or re.fullmatch(r"hpcadj (run|gradcheck|check|hesscheck|plan|calibrate|analyze|invert)", span)
                or not re.fullmatch(r"[\w.$=/'\"(); -]+", span)
                or (span.startswith(". ") and "/" not in span.split()[1])):  # prose between two spans
            continue
        out.append(span)
    return out


def documented() -> dict[str, list[str]]:
    """Document -> its commands, in document order (fenced first, then inline)."""
    found = {}
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        cmds = fenced_commands(text) + inline_commands(text)
        found[doc] = list(dict.fromkeys(cmds))
    return found


# -- how each is run -----------------------------------------------------------------------------------
def small(cmd: str, steps: int = MAX_STEPS) -> str:
    """The same command with small grids and step counts."""
    cmd = re.sub(r"--grid (\d+(?:x\d+)+)", lambda m: "--grid " + SMALL_GRID[m.group(1).count("x") + 1], cmd)
    return re.sub(r"--steps (\d+)", lambda m: f"--steps {min(int(m.group(1)), steps)}", cmd)


BURGERS = ("mpirun -n 2 hpcadj run --model burgers --grid 128x128 --steps 400 --schedule auto --ram 8 "
           "--disk 1GiB --pfs 64 --pfs-file /scratch/$USER/ck.h5 --local-dir $TMPDIR --json")
WAVE = ("mpirun -n 2 hpcadj run --model wave --grid 256x256 --ram 4 --disk 16 --pfs 64 --pfs-file $SCRATCH/ck.h5 "
        "--run-dir $SCRATCH/run1")
INVERT = ("mpirun -n 2 hpcadj invert --grid 32x32 --steps 20 --dt 2e-3 --invert kappa --bounds kappa:0.5:3 "
          "--max-it 10 --ram 4 --run-dir inv --log-dir inv/log -tao_ls_type armijo")
PLAN = "hpcadj plan --steps 1000 --ram 20 [--disk 40 --pfs 200 --costs burgers.json] [--json] [--actions]"


def _json_line(proc):
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def _has(*needles):
    def check(proc, work):
        for needle in needles:
            assert needle in proc.stdout + proc.stderr, needle
    return check


def _files(*names):
    def check(proc, work):
        for name in names:
            assert (work / name).is_file() and (work / name).stat().st_size > 0, name
    return check


def _all(*checks):
    def check(proc, work):
        for c in checks:
            c(proc, work)
    return check


#: documented command -> list of (shell command run here, expected exit status, check(proc, workdir));
#: ``$SCRATCH``, ``$TMPDIR`` and ``$USER`` point into the working directory, ``.venv`` is linked there
RUN: dict[str, list[tuple]] = {
    # -o setup: scripts/setup.sh already ran (make test starts with it); here it could reinstall the venv
    "make demo": [("make -o setup -C $ROOT demo DEMO_DIR=$PWD/demo", 0,
                   _all(_has("schedule multilevel", "level pfs", "# hpcadj analyze"),
                        _files("demo/gradient.h5")))],
    ". .venv/bin/activate": [(". .venv/bin/activate && command -v hpcadj", 0, _has(".venv/bin/hpcadj"))],
    "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1": [
        ("export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", 0, None)],
    "mpirun -n 2 hpcadj run --model heat --grid 128x128 --steps 100 --dt 1e-4 --theta 0.5": [
        (small("mpirun -n 2 hpcadj run --model heat --grid 128x128 --steps 100 --dt 1e-4 --theta 0.5"), 0,
         _has("hpcadj run: heat 16x16, 12 steps, 2 rank(s)"))],
    "mpirun -n 3 --oversubscribe hpcadj run --grid 32x32x32 --steps 20 --json": [
        (small("mpirun -n 3 --oversubscribe hpcadj run --grid 32x32x32 --steps 20 --json"), 0,
         lambda proc, work: _json_line(proc)["ranks"] == 3 or pytest.fail(proc.stdout))],
    # the README's own PETSc-option example (its -h prefix once made argparse take it for --help)
    "mpirun -n 2 hpcadj run --grid 64x64 --gradient-out grad.h5 -log_view": [
        (small("mpirun -n 2 hpcadj run --grid 64x64 --gradient-out grad.h5 -log_view"), 0,
         _all(_has("hpcadj:forward", "hpcadj:adjoint"), _files("grad.h5"))),
        ("mpirun -n 2 hpcadj run --model heat --grid 16x16 --steps 2 -heat_ksp_type gmres -heat_ksp_view", 0,
         _has("type: gmres"), {"--model", "--steps", "-heat_ksp_type", "-heat_ksp_view"})],
    "mpirun -n 2 hpcadj gradcheck --grid 32x32 --steps 20": [
        ("mpirun -n 2 hpcadj gradcheck --grid 12x12 --steps 6", 0, _has("PASSED"))],
    # srun needs SLURM: the same hpcadj command under mpirun
    "srun -n 64 hpcadj run --model heat --grid 1024x1024 --steps 1000": [
        (small("mpirun -n 2 hpcadj run --model heat --grid 1024x1024 --steps 1000"), 0, _has("J = "))],
    BURGERS: [(small(BURGERS).replace("/scratch/$USER", "$SCRATCH"), 0,
               lambda proc, work: _json_line(proc)["model"] == "burgers" or pytest.fail(proc.stdout))],
    "hpcadj calibrate --model burgers --grid 128x128 --pfs-file /scratch/$USER/cal.h5 --out burgers.json": [
        ("hpcadj calibrate --model burgers --grid 16x16 --pfs-file $SCRATCH/cal.h5 --out burgers.json", 0,
         _files("burgers.json"))],
    # "..." stands for the run's own arguments: the burgers run above
    "mpirun -n 2 hpcadj run ... --costs burgers.json --minimize energy": [
        (small(BURGERS).replace("/scratch/$USER", "$SCRATCH").replace(" --json", "")
         + " --costs burgers.json --minimize energy", 0, _has("minimising energy"))],
    # optional parts: without them, and with all of them
    PLAN: [("hpcadj plan --steps 1000 --ram 20", 0, _has("predicted makespan", "relative units")),
           ("hpcadj plan --steps 1000 --ram 20 --disk 40 --pfs 200 --costs burgers.json --json --actions", 0,
            lambda proc, work: json.loads(proc.stdout.splitlines()[-1])["costs_file"] == "burgers.json"
            or pytest.fail(proc.stdout))],
    # "killed, stopped, or the node died": killed here by fault injection, then resumed
    WAVE: [("HPCADJ_INJECT_KILL=0:30 " + small(WAVE), 137, None)],
    WAVE + " --resume": [(small(WAVE) + " --resume", 0, _has("hpcadj run: wave 16x16"))],
    "hpcadj run --model burgers --grid 64x64 --adaptive --t-final 1.0 --ram 8 --schedule online": [
        ("hpcadj run --model burgers --grid 16x16 --adaptive --t-final 0.2 --ram 8 --schedule online", 0,
         _has("hpcadj run: burgers 16x16", "schedule online"))],
    "python -c 'import hpcadj.imports as s; s.check()'": [
        ("python -c 'import hpcadj.imports as s; s.check()'", 0, _has("(HDF5", "mpi)"))],
    "hpcadj run --help": [("hpcadj run --help", 0, _has("usage: hpcadj run", "--run-dir"))],
    # experiments/telemetry: the sweep at a small size, its outputs in the working directory (the
    # committed figure and tables stay as they are)
    "mpirun -n 2 .venv/bin/python experiments/telemetry/sweep.py /tmp/sweepfig --steps 80": [
        ("mpirun -n 2 .venv/bin/python $ROOT/experiments/telemetry/sweep.py sweepfig --steps 6 --grid 16x16", 0,
         None)],
    ".venv/bin/hpcadj analyze /tmp/sweepfig/logs --plot experiments/telemetry/pareto.png > "
    "experiments/telemetry/results.md": [
        (".venv/bin/hpcadj analyze sweepfig/logs --plot pareto.png > results.md", 0,
         _files("pareto.png", "results.md"))],
    ".venv/bin/hpcadj analyze /tmp/sweepfig/logs --csv > experiments/telemetry/results.csv": [
        (".venv/bin/hpcadj analyze sweepfig/logs --csv > results.csv", 0, _files("results.csv"))],
    # docs/inversion.md: an inversion, then its resume raising the cap (the run directory carries over)
    INVERT: [(small(INVERT), 0, _all(_has("hpcadj invert: heat 16x16, 12 steps, 2 rank(s)"),
                                      _files("inv/inversion.json", "inv/log/inversion.jsonl")))],
    # the RK study's tables, printed from its committed rows
    "python experiments/mixed/rk_runs.py --tables experiments/mixed/rk_runs.jsonl": [
        (".venv/bin/python $ROOT/experiments/mixed/rk_runs.py --tables $ROOT/experiments/mixed/rk_runs.jsonl", 0,
         _has("TSAdjointSolve wall", "128x128, 1, 200"))],
    INVERT.replace("--max-it 10", "--max-it 15") + " --resume": [
        (small(INVERT.replace("--max-it 10", "--max-it 15")) + " --resume", 0,
         _has("hpcadj invert: heat 16x16, 12 steps, 2 rank(s)"))],
}

SLURM = "needs a SLURM cluster; tests/cluster/test_slurm_jobs.py submits the job scripts to a private one"
SITE = "installs or loads a cluster site's software (network, module system): not on this VM"
STUDY = ("a study that takes minutes even at --quick size; `make experiments` (mk/experiments.mk) runs "
         "the studies")
FRAGMENT = "a flag or launcher named in prose, not a command of its own (the full commands run above)"
TS_PAGE = "tests/mpi/test_ts_docs.py runs docs/ts.md's example and command block as written (SLURM's part locally)"
#: (pattern, reason): commands that cannot run here, each with why
NOT_RUN: list[tuple[str, str]] = [
    (r"make test", "the whole suite (about 10 minutes), of which this test is a part"),
    (r"make test-cluster", "the multi-node SLURM suite, minutes; tests/test_slurm_cluster*.py"),
    (r"(mpirun -n \d )?python my_ts\.py( .*)?|mpirun (--oversubscribe )?-n \d hpcadj run --model my_ts\.py:build .*"
     r"|hpcadj check --model my_ts\.py:build"
     r'|(\w+=("[^"]*"|\S*) )+sbatch jobs/gradient\.sbatch', TS_PAGE),
    (r"make test-fast", "the unit tier of this very suite (pytest tests/unit)"),
    (r"make lint", "scripts/run-tests.sh runs ruff before pytest: make test fails on a finding"),
    (r"make setup", "scripts/setup.sh, which make test runs first (and the venv these commands use)"),
    (r'(\w+=("[^"]*"|\S+) )*sbatch .*', SLURM),
    (r'(\w+=("[^"]*"|\S+) )*bash jobs/\w+\.sbatch', SLURM + " (run by bash, the script submits itself)"),
    (r"srun --mpi=\S+", FRAGMENT),
    (r"scancel .*|scontrol .*", SLURM),
    (r"python tests/slurm_cluster\.py( --nodes \d+)?",
     "starts SLURM daemons until Ctrl-C; tests/cluster/test_slurm_jobs.py starts and stops the same cluster"),
    (r"module load( .*)?", SITE),
    (r"python3 -m venv --system-site-packages ~/venvs/hpcadj && \. ~/venvs/hpcadj/bin/activate",
     SITE + "; scripts/setup.sh makes this project's venv the same way (every make test runs it)"),
    (r"(CC=mpicc \S+ \S+ )?pip install .*", SITE),
    (r"mpirun -n 2 python reaction\.py( \S+)?", "tests/mpi/test_readme_example.py runs exactly this, on 1 and 2 ranks"),
    (r"hpcadj (run|plan) --model( NAME)?|hpcadj invert --(adaptive|run-dir|memory)|hpcadj run --schedule mixed",
     FRAGMENT),
    (r"hpcadj run --model reaction", "test_plugin_model_recipe below declares the entry point and runs it"),
    (r"make soak|\.venv/bin/python experiments/soak/durable_forward\.py",
     "the soak takes minutes; tests/mpi/test_soak_small.py runs its --quick version"),
    (r"(\.venv/bin/)?python experiments/\w+/(run|plan_choice)\.py", STUDY),
    (r"\.venv/bin/python experiments/mixed/runs\.py --grid 128x128x128 --steps 300"
     r"|\.venv/bin/python experiments/mixed/levels_runs\.py --levels( \d+:\d+)+"
     r"|mpirun -n 2 hpcadj run --model wave --grid 128x128x128 --steps 300", STUDY + " (about 3 GiB a rank)"),
    (r"\.venv/bin/python experiments/mixed/plans\.py( \[--out DIR\] \[--quick\])?",
     "plans only, but tens of seconds of dynamic programmes; tests/unit/test_schedules_mixed.py checks the planner"),
    (r"mpirun -n \d python experiments/memory_budget/compressed\.py .*", STUDY),
    (r"\.venv/bin/python experiments/online/(walltime|variants|planning_cost)\.py( \S+)*", STUDY),
    (r"git show [0-9a-f]{7,40}:\S+ > /tmp/\S+", "an older version of a file, for a study's before/after figures"),
    (r"make experiments|make experiment-levels EXPERIMENTS_OUT= EXPERIMENT_FLAGS=|make experiment-[a-z-]+", STUDY),
    (r"mpirun -n [12]", FRAGMENT),
    (r"(mpirun -n 2 )?hpcadj run --json( --costs)?", "names what a study's script launches: " + FRAGMENT),
    (r"hpcadj analyze --sacct|hpcadj analyze --plot|hpcadj run --ram/--disk/--pfs", FRAGMENT),
    (r"hpcadj (run|invert) --resume|hpcadj (hesscheck|run) --memory", FRAGMENT),
    (r"python experiments/mixed/rk_runs\.py --grid \d+ --ranks \d .*", STUDY),
    (r"hpcadj run --model wave --grid 128x128x128 --steps 300 --ram 512MiB", STUDY + " (the Devito comparison)"),
]


def classify(cmd: str):
    """('run', specs) or ('skip', reason) or None for a command nobody decided about."""
    if cmd in RUN:
        return "run", RUN[cmd]
    for pattern, reason in NOT_RUN:
        if re.fullmatch(pattern, cmd):
            return "skip", reason
    return None


def test_every_documented_command_is_run_or_excused():
    """A command added to a document must be added to RUN or NOT_RUN (with its reason)."""
    undecided = [f"{doc}: {cmd}" for doc, cmds in documented().items() for cmd in cmds if classify(cmd) is None]
    assert not undecided, "documented commands neither run nor excused:\n" + "\n".join(undecided)


def test_no_stale_entries():
    """Every RUN entry and NOT_RUN pattern still matches a command in some document."""
    cmds = [cmd for cmds in documented().values() for cmd in cmds]
    assert not [c for c in RUN if c not in cmds], [c for c in RUN if c not in cmds]
    stale = [p for p, _ in NOT_RUN if not any(re.fullmatch(p, c) for c in cmds)]
    assert not stale, stale


def test_run_commands_keep_the_documented_flags():
    """What runs here has the documented flags (only values shrink, only launchers change)."""
    def flags(cmd):
        return sorted(t for t in shlex.split(cmd.replace("[", " ").replace("]", " ")) if t.startswith("-")
                      and not re.fullmatch(r"-n|--oversubscribe|-\d.*", t))
    for doc_cmd, specs in RUN.items():
        if doc_cmd.startswith((". ", "export ", "make ", "python -c")):
            continue
        documented_flags = set(flags(doc_cmd.replace(" ... ", " " + BURGERS + " ")))
        for shell, _, _, *added in specs:
            ran = set(flags(shell))
            added = added[0] if added else {"--grid", "--steps"}  # a size given where the doc has none
            assert ran - documented_flags <= added, (doc_cmd, shell)
            if "[" not in doc_cmd and not added - {"--grid", "--steps"}:
                dropped = {"--json"} if " ..." in doc_cmd else set()  # "..." is the run's arguments
                assert documented_flags - dropped <= ran, (doc_cmd, shell)


def _workdir(tmp_path: Path) -> tuple[Path, dict]:
    work = tmp_path / "work"
    (work / "scratch").mkdir(parents=True)
    (work / ".venv").symlink_to(ROOT / ".venv")
    env = mpi_env({"ROOT": str(ROOT), "SCRATCH": str(work / "scratch"), "TMPDIR": str(work),
                   "USER": os.environ.get("USER", "root"), "HPCADJ_PROGRESS_INTERVAL": "3600",
                   "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"})
    return work, env


@pytest.mark.timeout(300)
@pytest.mark.parametrize("doc", [d for d in DOCS if any(classify(c) and classify(c)[0] == "run"
                                                        for c in documented()[d])])
def test_documented_commands_run(doc, tmp_path):
    work, env = _workdir(tmp_path)
    ran = 0
    for cmd in documented()[doc]:
        kind, what = classify(cmd) or ("undecided", None)
        if kind != "run":
            continue
        for shell, status, check, *_ in what:
            proc = run(["bash", "-c", shell], timeout=TIMEOUT, env=env, cwd=work)
            where = f"\ndocumented: {cmd}\nran: {shell}\nrc: {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}" \
                    f"\nstderr:\n{proc.stderr[-3000:]}"
            assert proc.returncode == status, where
            assert "Traceback" not in proc.stderr, where
            if check is not None:
                try:
                    check(proc, work)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}{where}") from None
            ran += 1
    assert ran > 0


# -- docs/example.md's plug-in recipe ------------------------------------------------------------------
def _plugin(tmp_path: Path) -> dict:
    """docs/example.md's ReactionDiffusion as package ``mypkg``, declared under the ``hpcadj.models``
    entry point by a .dist-info directory (what pip writes for that page's pyproject.toml line)."""
    text = (ROOT / "docs" / "example.md").read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                   if "class ReactionDiffusion(Stepper)" in b)
    line = re.search(r'`\[project\.entry-points\."hpcadj\.models"\] (\w+) = "([\w.:]+)"`', text)
    assert line, "docs/example.md no longer shows the entry-point line"
    name, target = line.groups()
    pkg = tmp_path / "site"
    (pkg / "mypkg").mkdir(parents=True)
    (pkg / "mypkg" / "__init__.py").write_text("")
    (pkg / "mypkg" / "reaction.py").write_text(example)
    info = pkg / "mypkg-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[hpcadj.models]\n{name} = {target}\n")
    return mpi_env({"PYTHONPATH": str(pkg), "HPCADJ_PROGRESS_INTERVAL": "3600"})


@pytest.mark.timeout(120)
def test_plugin_model_recipe(tmp_path):
    """``hpcadj run --model reaction`` as docs/example.md declares it: the summary (the model has no grid
    in describe(): it once died with KeyError 'grid' after the gradient), --json, and --grid, which
    its from_args ignores, refused instead of silently dropped."""
    env = _plugin(tmp_path)
    hpcadj = str(ROOT / ".venv" / "bin" / "hpcadj")
    human = run(["mpirun", "-n", "2", "-x", "PYTHONPATH", hpcadj, "run", "--model", "reaction", "--steps", "10"],
                timeout=TIMEOUT, env=env)
    assert human.returncode == 0 and "Traceback" not in human.stderr, human.stdout + human.stderr
    assert "hpcadj run: reaction (no grid" in human.stdout and "10 steps, 2 rank(s)" in human.stdout, human.stdout
    js = run(["mpirun", "-n", "2", "-x", "PYTHONPATH", hpcadj, "run", "--model", "reaction", "--steps", "10",
              "--json"], timeout=TIMEOUT, env=env)
    info = _json_line(js)
    assert info["model"] == "reaction" and info["grid"] is None and info["adjoint_steps"] == 10, info
    refused = run([hpcadj, "run", "--model", "reaction", "--grid", "256x256"], timeout=TIMEOUT, env=env)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith("hpcadj: error: model reaction does not use --grid"), lines
