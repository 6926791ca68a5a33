"""The human output of ``hpcadj check`` (the checks themselves: tests/unit/test_contract.py and
tests/mpi/ranks/test_contract.py)."""

from ..helpers import hpcadj_in_process


def test_check_command_human_output():
    proc = hpcadj_in_process(["check", "--model", "heat", "--grid", "10x8", "--check-steps", "2"])
    text = proc.stdout
    assert proc.returncode == 0, text + proc.stderr
    assert "step_pure" in text and "PASSED" in text
    assert "describe" in text and "NOT CHECKED" in text and "--vary" in text
