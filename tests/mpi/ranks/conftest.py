"""Fixtures for tests that run on every rank under mpirun."""

import os
import sys

import pytest


def pytest_configure(config):
    """Give every rank its own pytest base temp directory (ranks must not wipe each other's)."""
    base = os.environ.get("HPCADJ_MPI_BASETEMP")
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
    if base:
        config.option.basetemp = os.path.join(base, f"rank{rank}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails on one rank stops the whole job at once, its traceback on stderr: the other
    ranks would otherwise wait in the next test's collective until the suite's timeout."""
    outcome = yield
    report = outcome.get_result()
    mpi = sys.modules.get("mpi4py.MPI")
    if report.failed and mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.size > 1:
        sys.stderr.write(f"rank {mpi.COMM_WORLD.rank}: {report.nodeid} failed ({report.when}):\n"
                         f"{report.longreprtext}\n")
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(1)


@pytest.fixture(scope="session")
def comm():
    from hpcadj.imports import mpi, petsc

    petsc()
    return mpi().COMM_WORLD


@pytest.fixture
def shared_tmp(comm, tmp_path_factory):
    """A directory path agreed by all ranks (rank 0's tmp dir, broadcast)."""
    path = str(tmp_path_factory.mktemp("shared")) if comm.rank == 0 else None
    return comm.bcast(path, root=0)
