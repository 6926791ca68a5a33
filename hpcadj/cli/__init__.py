"""The ``hpcadj`` command: one subcommand per module in this package.

Bad input never shows a traceback: a :class:`CliError` (or an argparse error) prints one line on
stderr (rank 0 only under MPI) and exits with status 2. Arguments with a single leading dash that
hpcadj does not know (``-log_view``, ``-heat_ksp_type cg``) are left to PETSc.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: subcommand modules, in ``--help`` order; each has ``add_parser(subparsers)`` and ``main(args)``.
SUBCOMMANDS = ["run", "gradcheck", "plan", "calibrate", "analyze"]

EXIT_USAGE = 2


class CliError(Exception):
    """Bad input from the user: reported as one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line, not usage plus message."""

    def error(self, message):
        raise CliError(f"{self.prog}: {message}")


#: rank variables of the launchers (OpenMPI, MPICH/Hydra, PMIx, SLURM's srun), for errors raised before
#: MPI is initialised (a bad flag): every rank parses the same command line, only rank 0 may report it
_LAUNCHER_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def _rank() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        return mpi.COMM_WORLD.rank
    for name in _LAUNCHER_RANK_VARS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def report_error(message: str) -> int:
    """Print ``message`` as the one error line (rank 0 only) and return the usage exit status."""
    if _rank() == 0:
        print(f"hpcadj: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def build_parser() -> Parser:
    parser = Parser(prog="hpcadj", description="Checkpointed discrete adjoints of PETSc time steppers.")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"hpcadj {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(f".{name}", __name__)
        module.add_parser(sub)
    return parser


def split_petsc_options(unknown: list[str]) -> list[str]:
    """Return the PETSc options among ``unknown``; anything else is a usage error."""
    petsc_opts: list[str] = []
    expect_value = False
    for token in unknown:
        if token.startswith("-") and not token.startswith("--") and len(token) > 1 and not _is_number(token):
            petsc_opts.append(token)
            expect_value = True
        elif expect_value and not token.startswith("--"):
            petsc_opts.append(token)
            expect_value = False
        else:
            raise CliError(f"unrecognized argument: {token}")
    return petsc_opts


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Run one command in this process (tests call it repeatedly; PETSc stays initialised)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        args.petsc_options = split_petsc_options(unknown)
        return int(args.func(args) or 0)
    except CliError as exc:
        return report_error(str(exc))


def console() -> int:
    """The ``hpcadj`` executable: one command, then PETSc finalised alike on every rank.

    Python's cyclic collector stays off (the driver and :func:`hpcadj.stack.finalize` collect on
    the solver thread), so no PETSc object dies on an I/O thread. An unexpected exception on one
    rank aborts the whole job after its traceback: the other ranks would otherwise wait in their
    next collective forever.
    """
    import gc
    import traceback

    gc.disable()
    try:
        status = main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - reported, then the job must end on every rank
        traceback.print_exc()
        sys.stderr.flush()
        _abort_job(1)
        raise
    from ..stack import finalize

    finalize()
    return status


def _abort_job(status: int) -> None:
    """MPI_Abort when MPI runs on several ranks (one rank failing alone must not hang the rest)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.size > 1:
        mpi.COMM_WORLD.Abort(status)
