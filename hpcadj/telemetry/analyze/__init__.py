"""Analysis of hpcadj run logs: per-run phase tables, cross-run comparison, Pareto plot; and of
inversion logs (``inversion.jsonl``): the convergence table and misfit against iterate, time, energy.

Works on log directories copied off a cluster: plain files, no MPI, no PETSc. A broken log (a
truncated or corrupt line, a missing rank file, a rank that stopped early, a missing summary) is
analysed as far as it goes, and every such problem is listed in ``RunData.problems``.

Reading logs (:mod:`.logs`), one run's numbers (:mod:`.run`), runs side by side (:mod:`.compare`),
what is printed and drawn for runs (:mod:`.report`), and inversion logs (:mod:`.inversion`).
"""

from .compare import MEMORY_METRICS, compare, memory_metric
from .inversion import (INVERSION_FILE, InversionLog, analyse_inversion, analyze_inversions, find_inversion_dirs,
                        inversion_csv, inversion_markdown, inversion_plot, load_inversion)
from .logs import AnalyzeError, RunData, distinguishing_suffixes, find_run_dirs, is_run_dir, load_run
from .report import check_output_path, csv_report, markdown_report, pareto_plot
from .run import STATUSES, analyse_run, analyze, phase_table, run_status

__all__ = ["INVERSION_FILE", "MEMORY_METRICS", "STATUSES", "AnalyzeError", "InversionLog", "RunData",
           "analyse_inversion", "analyse_run", "analyze", "analyze_inversions", "check_output_path", "compare",
           "csv_report", "distinguishing_suffixes", "find_inversion_dirs", "find_run_dirs", "inversion_csv",
           "inversion_markdown", "inversion_plot", "is_run_dir", "load_inversion", "load_run", "markdown_report",
           "memory_metric", "pareto_plot", "phase_table", "run_status"]
