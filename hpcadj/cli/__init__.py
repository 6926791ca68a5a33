"""The ``hpcadj`` command: one subcommand per module in this package.

Bad input never shows a traceback: a :class:`CliError` (or an argparse error) prints one line on
stderr (rank 0 only under MPI) and exits with status 2; so do memory running out and a failing file
system or checkpoint level (:func:`~.common.storage_failure`), whatever the command. An error on some
ranks only is agreed on (:func:`agree`): every rank exits 2 and rank 0's one line names the failing
ranks; where the others went on into a collective call and cannot come to agree, the failing rank
prints its line and ends the job (MPI_Abort), so nothing hangs. Arguments with a
single leading dash that hpcadj does not define (``-log_view``, ``-heat_ksp_type cg``) are PETSc's:
they are taken out of the command line before argparse sees it, because argparse would read
``-heat_ksp_type`` as ``-h`` followed by ``eat_ksp_type``. In a process where PETSc already runs
they go into its options database; an in-process :func:`main` takes them out after its command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from ..collective import Agreement, Unreachable, one_line
from ..imports import clear_options, is_number

#: subcommand modules, in ``--help`` order; each has ``add_parser(subparsers)`` and ``main(args)``.
SUBCOMMANDS = ["run", "gradcheck", "hesscheck", "check", "plan", "calibrate", "analyze", "invert"]
#: the subcommands that initialise PETSc; the others refuse PETSc options rather than ignore them
PETSC_COMMANDS = {"run", "gradcheck", "hesscheck", "check", "calibrate", "invert"}

EXIT_USAGE = 2


class CliError(Exception):
    """Bad input from the user: reported as one line on stderr, exit status 2."""

    #: every rank raised it, with this message (:func:`agree`): reported without agreeing again
    agreed = False


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line, not usage plus message, and which takes no
    abbreviation of a long option (``--ra 4`` is an error, not ``--ram 4``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        raise CliError(f"{command}: {message}" if command else message)


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


_AGREEMENT: Agreement | None = None


def start_agreement() -> None:
    """Initialise MPI and set aside the communicator failures are agreed on (on more than one rank).

    Collective over COMM_WORLD: call it where every rank is, before anything that may fail on some
    ranks only (a command's start); later calls do nothing.
    """
    global _AGREEMENT
    from ..imports import mpi

    world = mpi().COMM_WORLD
    if _AGREEMENT is None and world.size > 1:
        _AGREEMENT = Agreement(world)


def agree(problem: str | None, comm=None) -> None:
    """The one rule for an error on some ranks: if ``problem`` is set on any rank, raise the same
    CliError on every rank, its message naming the failing ranks (none when all failed alike);
    else return. A rank whose problem the others do not come to agree on in time (they went on into
    a collective call) prints it, naming its rank, and ends the job. ``comm``: the ranks concerned;
    a communicator smaller than the world's is not agreed on here (the error is raised as it is).
    """
    if _AGREEMENT is None or (comm is not None and comm.size != _AGREEMENT.size):
        if problem:
            raise CliError(problem)
        return
    try:
        failed = _AGREEMENT.problems(problem)
    except Unreachable:
        _end_alone(problem)
    if failed:
        error = CliError(one_line(failed, _AGREEMENT.size))
        error.agreed = True
        raise error


@contextlib.contextmanager
def together(comm=None, errors=(CliError,), raise_as=CliError):
    """Run the block on every rank; one of ``errors`` it raises on any rank becomes :func:`agree`'s
    error on all (as ``raise_as``). Use it around what may fail on some ranks only (reading a file,
    building the model), before the next collective call."""
    problem = None
    try:
        yield
    except errors as exc:
        problem = str(exc)
    try:
        agree(problem, comm)
    except CliError as exc:
        if raise_as is CliError:
            raise
        raise raise_as(str(exc)) from None


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


def _single_dash_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every single-dash option string hpcadj defines (``-h``), in the parser and its subcommands."""
    found, todo = set(), [parser]
    while todo:
        p = todo.pop()
        for action in p._actions:
            found.update(o for o in action.option_strings if not o.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


def _is_petsc_option(token: str, ours: set[str]) -> bool:
    return (token.startswith("-") and not token.startswith("--") and len(token) > 1
            and token not in ours and not is_number(token) and not _is_negative_value(token))


def _is_negative_value(token: str) -> bool:
    """``-1GiB``, ``-3``, ``-.5``: a value with a minus sign (no option name starts with a digit)."""
    return len(token) > 1 and token[0] == "-" and (token[1].isdigit() or token[1] == ".")


def take_petsc_options(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (hpcadj's arguments, PETSc's options) before argparse sees it.

    A single-dash token hpcadj does not define is a PETSc option, whatever its first letters; the
    token after it is its value unless it looks like an option itself (a negative number is a value)
    or names the subcommand.
    """
    ours = _single_dash_options(parser)
    mine: list[str] = []
    petsc: list[str] = []
    command_seen = False
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":  # everything after is positional: not ours to split
            mine.extend(argv[i:])
            break
        if _is_petsc_option(token, ours):
            petsc.append(token)
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if (nxt is not None and (not nxt.startswith("-") or is_number(nxt))
                    and (command_seen or nxt not in SUBCOMMANDS)):
                petsc.append(nxt)
                i += 1
        elif (_is_negative_value(token) and not is_number(token) and mine and mine[-1].startswith("--")
              and "=" not in mine[-1]):
            mine[-1] += f"={token}"  # argparse reads "-1GiB" as an option, "--memory=-1GiB" as a value
        else:
            command_seen = command_seen or token in SUBCOMMANDS
            mine.append(token)
        i += 1
    return mine, petsc


def split_petsc_options(unknown: list[str]) -> list[str]:
    """Return the PETSc options among ``unknown``; anything else is a usage error."""
    petsc_opts: list[str] = []
    expect_value = False
    for token in unknown:
        if token.startswith("-") and not token.startswith("--") and len(token) > 1 and not is_number(token):
            petsc_opts.append(token)
            expect_value = True
        elif expect_value and not token.startswith("--"):
            petsc_opts.append(token)
            expect_value = False
        else:
            raise CliError(f"unrecognized argument: {token}")
    return petsc_opts


def main(argv: list[str] | None = None, *, keep_petsc_options: bool = False) -> int:
    """Run one command in this process (tests call it repeatedly; PETSc stays initialised). Its
    PETSc options leave PETSc's database after it, unless ``keep_petsc_options`` (the ``hpcadj``
    executable: ``-log_view`` reports when PETSc is finalised)."""
    argv = sys.argv[1:] if argv is None else argv
    from . import models

    models.PLUGGED.clear()
    try:
        spec = models.spec_in_argv(list(argv))
        if spec is not None:  # before the parser: the model may add options of its own
            start_agreement()  # a file some ranks cannot read must not leave the others waiting
            with together():
                try:
                    models.plug(spec)
                except ValueError as exc:
                    raise CliError(str(exc)) from None
        parser = build_parser()
        argv, petsc_opts = take_petsc_options(list(argv), parser)
        args, unknown = parser.parse_known_args(argv)
        petsc_opts += split_petsc_options(unknown)
        if petsc_opts and args.command not in PETSC_COMMANDS and not (args.command == "plan" and args.model):
            raise CliError(f"{args.command} runs no PETSc solver, so it takes no PETSc option "
                           f"(got {' '.join(petsc_opts)})")
        args.petsc_options = petsc_opts
        try:
            status = int(args.func(args) or 0)
        finally:
            if not keep_petsc_options:
                clear_options()
        agree(None)  # the ranks that finished meet any that failed late, and exit 2 with them
        return status
    except CliError as exc:
        return report_error(str(exc) if exc.agreed else _agreed_message(str(exc)))
    except Unreachable as exc:  # a library agreement this rank's problem never reached
        _end_alone(str(exc))
    except BaseException as exc:  # anything but memory running out or failing storage is re-raised
        from .common import storage_failure

        if out_of_memory(exc):
            return memory_exhausted(exc)
        failure = storage_failure(exc)
        if failure is None:
            raise
        return report_error(_agreed_message(str(failure)))


def _end_alone(problem: str) -> None:
    """This rank's problem, which the other ranks did not come to agree on (they are in a collective
    call it will never join): its one line, naming the rank, then the job ends."""
    print(f"hpcadj: error: rank {_rank()}: {problem}", file=sys.stderr, flush=True)
    _abort_job(EXIT_USAGE)
    raise SystemExit(EXIT_USAGE) from None  # Abort ended the job; kept for a static reader


def _agreed_message(message: str) -> str:
    """``message`` as every rank agrees on it (see :func:`agree`)."""
    try:
        agree(message)
    except CliError as exc:
        return str(exc)
    return message


def petsc_error(exc: BaseException) -> bool:
    """Whether ``exc`` is petsc4py's PETSc.Error (told by name: PETSc need not be loaded)."""
    return type(exc).__name__ == "Error" and type(exc).__module__.startswith("petsc4py")


def raised_from(exc: BaseException | None):
    """``exc``, then what it was raised from (``__cause__``, else ``__context__``), each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is an allocation that failed: numpy's
    MemoryError, or a PETSc error whose trace ends in PetscMalloc (its error code is unreliable)."""
    return any(isinstance(e, MemoryError) or (petsc_error(e) and (getattr(e, "ierr", None) == 55  # PETSC_ERR_MEM
                                                                   or "PetscMalloc" in str(e)))
               for e in raised_from(exc))


def memory_exhausted(exc: BaseException) -> int:
    """Report memory running out as the one error line, exit status 2; abort a multi-rank job.

    Another rank may be waiting in a collective, so the job cannot end normally. Ranks other than 0
    wait a moment first: if rank 0 ran out too, its line is the one that shows.
    """
    import time

    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "PetscMalloc" in str(exc):
        where = [line.split("] ")[-1].split(" at ")[0] for line in str(exc).splitlines() if " at " in line]
        detail = f"PETSc allocation failed in {where[0] if where else 'PETSc'}"
    message = (f"out of memory ({detail}); a smaller --grid, a smaller --ram budget or more nodes "
               f"may fit")
    mpi = sys.modules.get("mpi4py.MPI")
    size = mpi.COMM_WORLD.size if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() else 1
    rank = _rank()
    if size > 1:
        if rank != 0:
            time.sleep(2.0)
            message = f"rank {rank}: {message}"
        print(f"hpcadj: error: {message}", file=sys.stderr, flush=True)
        _abort_job(EXIT_USAGE)
        return EXIT_USAGE
    return report_error(message)


def console() -> int:
    """The ``hpcadj`` executable: one command, then PETSc finalised alike on every rank.

    Python's cyclic collector stays off (the driver and :func:`hpcadj.imports.finalize` collect on
    the solver thread), so no PETSc object dies on an I/O thread. An unexpected exception on one
    rank aborts the whole job after its traceback: the other ranks would otherwise wait in their
    next collective forever.
    """
    import gc
    import traceback

    gc.disable()
    try:
        status = main(keep_petsc_options=True)
    except SystemExit:
        raise
    except BrokenPipeError:
        status = _reader_gone()
    except BaseException:  # reported, then the job must end on every rank
        traceback.print_exc()
        sys.stderr.flush()
        _abort_job(1)
        raise
    from ..imports import finalize

    finalize()
    return status


def _reader_gone() -> int:
    """stdout's reader left (``hpcadj plan --actions | head -1``): end quietly, with the status of a
    process that SIGPIPE ended, as Unix tools do (stdout goes to /dev/null, so the exit's flush
    fails no more)."""
    import signal

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _abort_job(status: int) -> None:
    """MPI_Abort when MPI runs on several ranks (one rank failing alone must not hang the rest)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.size > 1:
        mpi.COMM_WORLD.Abort(status)
