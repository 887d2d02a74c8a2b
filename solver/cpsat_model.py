"""The CP-SAT model class of the planner's models: OR-Tools' own, less its start-up cost.

``cp_model.CpModel()`` installs a deprecated camel-case alias of every ``add_*``/``new_*``
method on each new instance (~0.1 ms). The LNS and the child polish build dozens of small
models per request, so that is a few ms of a 64-GPU solve's latency for names the planner never
uses. The subclass skips it; everything else, the solve included, is OR-Tools' own (the
version is pinned in ``pyproject.toml``).
"""

from __future__ import annotations

from ortools.sat.python import cp_model


class LeanCpModel(cp_model.CpModel):
    """``cp_model.CpModel`` without the pre-PEP8 method aliases."""

    def _add_pre_pep8_methods(self) -> None:
        """Skipped: the planner calls the snake-case names only."""
