"""One router per resource: plans, jobs, health (and metrics), dashboard."""
