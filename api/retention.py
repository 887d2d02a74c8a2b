"""Retention: delete plans older than ``REPACK_RETENTION_DAYS``, in small batches, every
``REPACK_RETENTION_INTERVAL_S``. Every replica may sweep; deletes are idempotent."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from api.database import Database
from api.errors import DatabaseUnavailable
from api.storage import utcnow

log = logging.getLogger("api.retention")
MAX_BATCHES_PER_SWEEP = 1000
"""A sweep stops after this many batches and resumes at the next interval."""


async def sweep(db: Database, days: float) -> int:
    """Delete plans older than ``days``; the number deleted."""
    cutoff = utcnow() - timedelta(days=days)
    total = 0
    for _ in range(MAX_BATCHES_PER_SWEEP):
        deleted = await db.delete_older_than(cutoff)
        total += deleted
        if deleted == 0:
            break
    return total


async def run_retention(db: Database, days: float, interval_s: float) -> None:
    """Sweep now and then every ``interval_s`` until cancelled."""
    while True:
        try:
            deleted = await sweep(db, days)
            if deleted:
                log.info("retention: deleted %d plans older than %g days", deleted, days)
        except DatabaseUnavailable:
            pass  # logged by the database guard; the next sweep retries
        await asyncio.sleep(interval_s)
