"""Errors the solver raises for requests it cannot plan; each names the request field to blame."""

from __future__ import annotations


class RepackError(Exception):
    """Base of every error the project raises on purpose; the edges (HTTP, CLI) map its
    subclasses to status codes and exit codes, the code that raises them picks neither."""


class PlanningError(RepackError, ValueError):
    """A request that passed schema validation but cannot be planned."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class DocumentError(RepackError, ValueError):
    """A file that is not a JSON/YAML document the schema can read: not UTF-8 text, nested
    deeper than the parser's recursion, an integer literal too long to convert."""


class InfeasibleRequestError(PlanningError):
    """No layout satisfies the memory limit for these lengths and parents."""


class PlanValidationError(RepackError, ValueError):
    """A plan breaks the layout rules; ``violations`` lists each broken rule, one per line."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__("; ".join(violations))
        self.violations = violations
