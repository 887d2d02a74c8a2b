"""Plan history in SQLAlchemy 2: one ``plans`` table, a repository with blocking methods.

SQLite (a file, zero set-up) by default, PostgreSQL by URL. A stored plan is immutable: its
bytes are what every later request for the same key gets back, also after a restart.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Engine,
    Float,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, defer, mapped_column, sessionmaker

from solver.schema import Plan, PlanRequest

MAX_STEP = 2**63 - 1
"""Steps are stored as 64-bit integers (BIGINT); larger ones are refused at the edge."""


class Base(DeclarativeBase):
    pass


class PlanRow(Base):
    """One accepted plan; ``body`` is the exact JSON every replay returns. The metrics are
    copied into columns so that history queries never parse plan bodies."""

    __tablename__ = "plans"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_plans_job_step"),)

    plan_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    job_id: Mapped[str | None] = mapped_column(String(200), index=True)
    step: Mapped[int | None] = mapped_column(BigInteger)
    request_digest: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(32))
    stopped_by: Mapped[str | None] = mapped_column(String(32))
    nodes: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    num_samples: Mapped[int] = mapped_column(Integer)
    step_time_ms: Mapped[float] = mapped_column(Float)
    baseline_step_time_ms: Mapped[float] = mapped_column(Float)
    speedup: Mapped[float] = mapped_column(Float)
    mfu: Mapped[float] = mapped_column(Float)
    baseline_mfu: Mapped[float] = mapped_column(Float)
    gap: Mapped[float | None] = mapped_column(Float)
    lower_bound_ms: Mapped[float | None] = mapped_column(Float)
    solve_ms: Mapped[float | None] = mapped_column(Float)
    lengths: Mapped[str] = mapped_column(Text, doc="JSON list of sample lengths (dashboard).")
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class StoredPlan:
    """What a replay needs: the request digest to compare and the bytes to send."""

    plan_id: str
    request_digest: str
    body: bytes


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    steps: int
    first_step: int | None
    last_step: int | None
    mean_speedup: float
    last_created_at: datetime


def _make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=8)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        # WAL lets readers (replays, dashboard) run while a plan is written. synchronous=NORMAL
        # in WAL mode survives any crash or restart of the service (the WAL is fsynced at
        # checkpoints); only an OS crash or power loss can drop the last commits. It takes the
        # ~5 ms fsync off every new plan.
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    return engine


class PlanStore:
    """Repository over the ``plans`` table; every method blocks (call it off the event loop)."""

    def __init__(self, url: str) -> None:
        self.engine = _make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def create_schema(self) -> None:
        Base.metadata.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        """Raise unless the database answers a trivial query."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def get(self, plan_id: str) -> StoredPlan | None:
        stmt = select(PlanRow.plan_id, PlanRow.request_digest, PlanRow.body).where(
            PlanRow.plan_id == plan_id
        )
        with self.engine.connect() as conn:  # Core, not a Session: this is the replay path
            row = conn.execute(stmt).first()
        return None if row is None else StoredPlan(row[0], row[1], row[2].encode())

    def get_row(self, plan_id: str) -> PlanRow | None:
        with self._sessions() as session:
            return session.get(PlanRow, plan_id)

    def insert(self, row: PlanRow) -> StoredPlan:
        """Store ``row`` unless its key exists; either way return what is stored now."""
        try:
            with self._sessions.begin() as session:
                session.add(row)
        except IntegrityError:
            stored = self.get(row.plan_id)
            if stored is None:  # the same (job_id, step) under another plan_id: impossible
                raise
            return stored
        return StoredPlan(row.plan_id, row.request_digest, row.body.encode())

    def list_jobs(self, after: str | None, limit: int) -> list[JobSummary]:
        """Jobs ordered by id, keyset-paginated (``after`` = last job id of the previous page)."""
        stmt = (
            select(
                PlanRow.job_id,
                func.count(),
                func.min(PlanRow.step),
                func.max(PlanRow.step),
                func.avg(PlanRow.speedup),
                func.max(PlanRow.created_at),
            )
            .where(PlanRow.job_id.is_not(None))
            .group_by(PlanRow.job_id)
            .order_by(PlanRow.job_id)
            .limit(limit)
        )
        if after is not None:
            stmt = stmt.where(PlanRow.job_id > after)
        with self._sessions() as session:
            rows = session.execute(stmt).all()
        return [JobSummary(r[0], r[1], r[2], r[3], float(r[4]), as_utc(r[5])) for r in rows]

    def list_steps(self, job_id: str, after: int | None, limit: int) -> Sequence[PlanRow]:
        """A job's plans ordered by step, keyset-paginated (``after`` = last step seen)."""
        stmt = (
            select(PlanRow)
            .options(defer(PlanRow.body), defer(PlanRow.lengths))
            .where(PlanRow.job_id == job_id, PlanRow.step.is_not(None))
            .order_by(PlanRow.step)
            .limit(limit)
        )
        if after is not None:
            stmt = stmt.where(PlanRow.step > after)
        with self._sessions() as session:
            return session.scalars(stmt).all()


def plan_row(request: PlanRequest, digest: str, plan: Plan, body: str) -> PlanRow:
    """The row that stores ``plan`` (serialised as ``body``) for ``request``."""
    m = plan.metrics
    return PlanRow(
        plan_id=plan.plan_id,
        job_id=request.job_id,
        step=request.step,
        request_digest=digest,
        mode=plan.mode,
        status=plan.status,
        stopped_by=m.stopped_by,
        nodes=request.cluster.nodes,
        gpus_per_node=request.cluster.gpus_per_node,
        num_samples=len(request.lengths),
        step_time_ms=m.step_time_ms,
        baseline_step_time_ms=m.baseline_step_time_ms,
        speedup=m.speedup,
        mfu=m.mfu,
        baseline_mfu=m.baseline_mfu,
        gap=m.gap,
        lower_bound_ms=m.lower_bound_ms,
        solve_ms=m.solve_ms,
        lengths=json.dumps(list(request.lengths), separators=(",", ":")),
        body=body,
        created_at=utcnow(),
    )


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; every stored time is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)
