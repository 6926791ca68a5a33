"""The checkpoint options (budgets, levels, plan, compression) of ``hpcadj run``, ``invert``, ``plan``
and ``calibrate``, each declared once: how it is parsed, and its help as each command words it.

:func:`add_checkpoint_options` adds some of them to a parser; :func:`checkpointing` turns the parsed
arguments into the library's :class:`~hpcadj.adjoint.session.Checkpointing`.
"""

from __future__ import annotations

from ..levelkinds import LEVEL_NAMES

#: ``hpcadj invert`` takes the checkpoint options as ``hpcadj run`` does, with the same help
_WORDED_AS = {"invert": "run"}


def _declarations(schedules) -> dict:
    """Flag -> (argparse keywords, {command: help}); the commands a flag is listed for take it."""
    budget = "slots (8) or bytes (2GiB, 512MB, 1.5e9B)"
    options = {
        "--schedule": ({"default": None, "choices": schedules}, {
            "run": "checkpoint plan (default: store-all without budgets, else auto)",
            "plan": "auto: revolve on one level, multilevel on several (default)"}),
        "--ram": ({"default": None, "metavar": "B"}, {
            "run": "RAM budget per rank: slots (8) or bytes (2GiB)",
            "plan": f"RAM budget: {budget}"}),
        "--disk": ({"default": None, "metavar": "B"}, {
            "run": "node-local disk budget per rank: slots or bytes",
            "plan": f"node-local disk budget: {budget}"}),
        "--pfs": ({"default": None, "metavar": "B"}, {
            "run": "parallel HDF5 file budget (whole file): slots or bytes",
            "plan": f"parallel file system (HDF5) budget: {budget}"}),
        "--memory": ({"default": None, "metavar": "BYTES"}, {
            "run": "whole-process memory budget per rank (3GiB): the model's working set, the driver's "
                   "states and I/O staging are predicted and the rest goes to RAM slots, --ram staying a "
                   "cap (default: $HPCADJ_MEMORY, else SLURM's memory per task)",
            "plan": "whole-process budget per rank: RAM slots are what it leaves beside the model's working "
                    "set (--model-states), the driver's states and I/O staging; needs --snapshot-bytes (one "
                    "snapshot on one rank); --ram stays a cap",
            "calibrate": "refuse to measure unless the model and one RAM slot fit this whole-process budget "
                         "per rank (as hpcadj run --memory)"}),
        "--local-dir": ({"default": None, "metavar": "DIR"}, {
            "run": "node-local directory (default: $HPCADJ_LOCAL_DIR, $SLURM_TMPDIR, $TMPDIR, /tmp)",
            "calibrate": "node-local directory to measure"}),
        "--pfs-file": ({"default": None, "metavar": "PATH.h5"}, {
            "run": "the parallel HDF5 checkpoint file",
            "calibrate": "measure parallel HDF5 here"}),
        # default None, so that giving both is seen and refused; :func:`checkpointing` reads None as on
        "--async": ({"dest": "async_io", "action": "store_const", "const": True, "default": None}, {
            "run": "asynchronous writes and read-ahead on file levels (default)"}),
        "--no-async": ({"dest": "async_io", "action": "store_const", "const": False, "default": None}, {
            "run": "synchronous file I/O",
            "calibrate": "do not measure how much of a write asynchronous I/O hides"}),
        "--keep-checkpoints": ({"action": "store_true"}, {
            "run": "keep checkpoint files after the run"}),
        "--time-tile": ({"type": int, "default": None, "metavar": "T"}, {
            "run": "advance runs of forward steps T at a time in cache (time tiling; bitwise the single "
                   "steps'; 1: single steps; default: the model's choice)"}),
        "--costs": ({"default": None, "metavar": "PROFILE.json"}, {
            "run": "cost profile from 'hpcadj calibrate' (else a brief calibration when needed)",
            "plan": "cost profile (forward/adjoint step, write/read per level); default: documented model"}),
        "--minimize": ({"default": "time", "choices": ("time", "energy")}, {
            "run": "what the planner minimises (default: time)",
            "plan": "what multilevel plans minimise (default: time)"}),
        "--compress": ({"default": None, "metavar": "SPEC"}, {
            "run": "compress snapshots on every level: none, lossless[:zstd|lz4|lz4hc|zlib|blosclz|zfp] "
                   "(bitwise) or lossy:TOL (zfp, absolute pointwise bound TOL)",
            "plan": "plan compressed snapshots (none, lossless[:cname], lossy:TOL) on every level, as hpcadj "
                    "run --compress: a slot is --compressed-bytes times the codec's margin, so byte budgets "
                    "(and --memory) buy that many more slots",
            "calibrate": "also time this codec (none, lossless[:cname], lossy:TOL) on the model's probed "
                         "states: encode/decode seconds and slot bytes per snapshot (hpcadj run --compress "
                         "measures them itself and adds them to the level costs; the profile stays raw)"}),
    }
    for name in LEVEL_NAMES:
        options[f"--compress-{name}"] = ({"default": None, "metavar": "SPEC"}, {
            "run": f"compression of the {name} level only (overrides --compress)"})
    options["--compress-probe"] = ({"type": int, "default": None, "metavar": "K"}, {
        "run": "size compressed slots from u_0, u_4 and u_K (default K=4; states that gain detail over "
               "time, like wave's, need a K further into the run)"})
    return options


def add_checkpoint_options(parser, command: str, *flags: str) -> None:
    """Add the checkpoint options ``flags`` (default: every one ``command`` takes) to ``parser`` (or an
    argument group), in that order; ``--async`` and ``--no-async`` together exclude each other."""
    from ..checkpoint.schedules import SCHEDULES

    worded = _WORDED_AS.get(command, command)
    options = _declarations(SCHEDULES)
    flags = flags or tuple(flag for flag, (_, helps) in options.items() if worded in helps)
    target = parser
    if "--async" in flags and "--no-async" in flags:
        target = parser.add_mutually_exclusive_group()
    for flag in flags:
        keywords, helps = options[flag]
        (target if flag in ("--async", "--no-async") else parser).add_argument(
            flag, **keywords, help=helps[worded])


def add_checkpoint_arguments(parser) -> None:
    """Every checkpoint option, in the groups ``checkpointing`` and ``compression``: ``run`` and ``invert``."""
    add_checkpoint_options(parser.add_argument_group("checkpointing"), "run",
                           "--schedule", "--ram", "--disk", "--pfs", "--memory", "--local-dir", "--pfs-file",
                           "--async", "--no-async", "--keep-checkpoints", "--costs", "--minimize", "--time-tile")
    add_checkpoint_options(parser.add_argument_group("compression"), "run", "--compress",
                           *(f"--compress-{name}" for name in LEVEL_NAMES), "--compress-probe")


#: :class:`Checkpointing` field -> the parsed argument it comes from
_FIELDS = {"ram": "ram", "disk": "disk", "pfs": "pfs", "local_dir": "local_dir", "pfs_file": "pfs_file",
           "keep": "keep_checkpoints", "schedule": "schedule", "minimize": "minimize", "costs": "costs",
           "memory": "memory", "memory_baseline": "memory_baseline", "compress": "compress",
           "compress_ram": "compress_ram", "compress_disk": "compress_disk", "compress_pfs": "compress_pfs",
           "compress_probe_steps": "compress_probe", "time_tile": "time_tile"}


def checkpointing(args):
    """The checkpoint options of the command line as the library's :class:`Checkpointing`; one the
    command does not take keeps the library's default."""
    from ..adjoint.session import Checkpointing

    given = {field: getattr(args, dest) for field, dest in _FIELDS.items() if hasattr(args, dest)}
    return Checkpointing(**given, async_io=getattr(args, "async_io", None) is not False)
