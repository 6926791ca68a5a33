"""An RK TS's adjoint data: the stages ``TSAdjointStep`` reads, kept from the forward step.

PETSc's RK adjoint step (``TSAdjointStep_RK``) reads the stage Vecs Y_0 .. Y_{s-1} of the step it
reverses (not the last one for a tableau with the FSAL property) and nothing else of the forward
run. Without them the adapter re-runs the step from u_i before each adjoint step. Declared as the
model's adjoint data (:meth:`~hpcadj.models.base.Stepper.adjoint_data_layout`), they are copied out
of the TS right after the step (``TSGetStages``, as PETSc's own memory trajectory keeps them when it
is not ``solution_only``) and placed back in before ``TSAdjointStep`` (``VecPlaceArray``, no copy): the same bits, so the gradient
is bitwise the one from a recomputed step and ``TSAdjointSolve``'s. Y_0 is u_i (explicit RK copies
the solution into it), so the stand-in state of a step reversed from its data is a copy of Y_0.

Other TS types declare none: θ-endpoint's stages are the states u_i and u_{i+1}, θ-midpoint's one
stage is reconstructed from them; neither re-runs a step.
"""

from __future__ import annotations

import weakref

from . import _capi


class StageData:
    """Mixed into :class:`~hpcadj.ts.stepper.TSStepper`: its RK stages as adjoint data."""

    def _init_stage_data(self) -> None:
        #: the stages the adjoint step reads (0: the TS declares no adjoint data)
        self._stages_read = _capi.rk_stages_read(self.ts) if self.ts_type == "rk" else 0
        self._stages_of = None   # (i, weakref to u_{i+1}): the step whose stages the TS holds now
        self._from_data = None   # (i, weakref to the stand-in u_i, stage arrays) for the next adjoint step

    def _stages_taken(self, i: int, u_next) -> None:
        """``step`` just took step i to ``u_next``: the TS's stage Vecs are that step's."""
        self._stages_of = (i, weakref.ref(u_next))

    def _stages_changed(self) -> None:
        """The TS's stage Vecs are about to hold something else (another step, an adjoint step's input)."""
        self._stages_of = None

    def adjoint_data_layout(self):
        if not self._stages_read:
            return None
        layout = self._layout_of(self._u0)
        return {f"stage{k}": layout for k in range(self._stages_read)}

    def adjoint_data(self, i: int, u, u_next):
        """Copies of step i's stages: from the TS when its last step was this one, else from the step
        taken again from u_i (the same bits)."""
        held = self._stages_of
        if held is None or held[0] != i or held[1]() is not u_next:
            x = u.copy()
            self._take_step(i, x, self._dt(i))
            self._stages_taken(i, x)
        shape = self._layout_of(self._u0).shape
        arrays = _capi.stage_arrays(self.ts, self._stages_read)
        return {f"stage{k}": a.reshape(shape) for k, a in enumerate(arrays)}

    def adjoint_data_state(self, i: int, data):
        """u_i as Y_0 holds it; the next :meth:`adjoint_step` of step i given this Vec reads the TS's stages
        from ``data`` instead of re-running the step."""
        import numpy as np

        vec = self._fresh_vec()
        vec.getArray()[...] = data["stage0"].reshape(-1)
        dtype = vec.getArray(readonly=True).dtype
        stages = [np.ascontiguousarray(data[f"stage{k}"], dtype=dtype).reshape(-1) for k in range(self._stages_read)]
        self._from_data = (i, weakref.ref(vec), stages)
        return vec

    def _stored_stages(self, i: int, u):
        """(stage Vec handles, arrays) with step i's stored stages placed in the TS (no copy) if ``u`` is the
        stand-in built from them, else None. The arrays must outlive the adjoint step; then
        ``_capi.reset_stages(handles)``."""
        held, self._from_data = self._from_data, None
        if held is None or held[0] != i or held[1]() is not u:
            return None
        self._stages_changed()
        return _capi.place_stages(self.ts, held[2]), held[2]
