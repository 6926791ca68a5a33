"""hpcadj: exact discrete adjoints of MPI-distributed PETSc time steppers inside a memory budget."""

__version__ = "0.1.0"
