"""The service's domain errors: what went wrong, never which HTTP status it becomes.

``api/problems.py`` is the one place that maps them to problem+json answers; the plan service,
the solver pool and the storage layer raise these and stay free of HTTP.
"""

from __future__ import annotations

from solver.errors import RepackError


class ServiceError(RepackError):
    """Base of the service's errors; ``retry_after_s`` is set when retrying later can help."""

    retry_after_s: int | None = None

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class DatabaseUnavailable(ServiceError):
    """The database refused, timed out or broke the connection; nothing was changed by us."""

    retry_after_s = 1


class Saturated(ServiceError):
    """The request cannot be solved now: the queue is full or no worker could start in time."""

    def __init__(self, message: str, retry_after_s: int, reason: str = "queue_full") -> None:
        super().__init__(message, retry_after_s)
        self.reason = reason
        """Metric label and log field: ``queue_full`` or ``deadline``."""


class SolverUnavailable(ServiceError):
    """A solver worker died (killed, out of memory, or stopped past its hard limit)."""


class SolveElsewhere(ServiceError):
    """The key's plan is being made, by another replica (its claim) or by a solve here that
    ran past the deadline, and was not ready within this request's budget."""


class IdempotencyConflict(ServiceError):
    """The key exists for a different request body."""


class PlanNotFound(ServiceError):
    """No stored plan with this id."""


class JobNotFound(ServiceError):
    """No stored plan for this job."""


class RequestTooLarge(ServiceError):
    """The request asks for more work or memory than a solver worker may spend on one step;
    ``field`` names the request field to shrink."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
