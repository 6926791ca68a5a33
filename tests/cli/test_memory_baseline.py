"""The memory baseline a budget counts from, in-process on one rank: it is measured after a warm-up
that runs what the command's computation will load (a model's own multi-step advance included), and
the gradient sessions ``hesscheck --memory`` runs after its products start with no more resident
than their baseline and their own count (experiments/hessian/budget_held.py: the same at wave
384x384 x 40 steps on 2 ranks, peak within the budget)."""

import json

import pytest

from ..helpers import hpcadj_in_process

MiB = 2 ** 20


@pytest.mark.parametrize("command", [["run"], ["hesscheck", "--halvings", "1"]])
def test_the_warm_up_runs_an_advance_before_the_baseline(monkeypatch, command):
    """wave's tiled advance (its own compiled kernel) runs on the warm-up model before the real model
    is built (the baseline is measured in between), so what it loads is in the baseline, not on top
    of a budget's slots."""
    from hpcadj.models.wave import WaveModel

    events = []
    advance, built = WaveModel.advance, WaveModel.__init__

    def recorded_advance(self, i, u, k, objective=False):
        events.append(("advance", self.field.global_shape, k))
        return advance(self, i, u, k, objective)

    def recorded_init(self, *args, **kwargs):
        events.append(("model",))
        built(self, *args, **kwargs)

    monkeypatch.setattr(WaveModel, "advance", recorded_advance)
    monkeypatch.setattr(WaveModel, "__init__", recorded_init)
    proc = hpcadj_in_process([*command, "--model", "wave", "--grid", "24x24", "--steps", "8", "--memory", "2GiB"])
    assert proc.returncode == 0, proc.stderr
    real = max(i for i, e in enumerate(events) if e == ("model",))  # the command's own model, built last
    warm = [e for e in events[:real] if e[0] == "advance" and e[2] >= 2]
    assert warm and all(shape != (24, 24) for _a, shape, _k in warm), events


def test_hesscheck_gradient_sessions_start_within_their_count(monkeypatch):
    """After the products, a gradient-difference session starts holding no more than its baseline
    (held for the command, with what the command keeps beside it) plus the model and its working
    states: the products' pooled buffers are given back and the command's directions and products
    are counted."""
    from hpcadj.adjoint.session import GradientSession
    from hpcadj.checkpoint.memory import process_rss_bytes
    from hpcadj.checkpoint.provision import ALLOCATOR_SLACK_BYTES

    starts = []
    plan = GradientSession.plan

    def recorded_plan(self):
        out = plan(self)
        m = self.memory
        starts.append((process_rss_bytes(), m.baseline_bytes - ALLOCATOR_SLACK_BYTES + m.model_bytes + m.working_bytes))
        return out

    monkeypatch.setattr(GradientSession, "plan", recorded_plan)
    proc = hpcadj_in_process(["hesscheck", "--model", "wave", "--grid", "160x160", "--steps", "10",
                              "--halvings", "1", "--memory", "2GiB", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"]
    sessions = starts[1:]  # the first is the up-front check, before any product
    assert len(sessions) >= 2
    over = [(rss - counted) / MiB for rss, counted in sessions]
    assert max(over) <= 0.5, over
