"""Stored profiles, measured steps and per-job profile versions (SQLAlchemy 2, own tables).

Four tables beside the plans (same database, own metadata, so the plan store is untouched):

* ``profiles``: every version of every named profile (``PUT /v1/profiles/{name}``); a PUT with
  the same constants is a no-op, a changed one adds version n + 1;
* ``step_requests``: the request each job step was planned with (what a refit re-prices);
* ``measurements``: what each job step really took (idempotent per ``(job_id, step)``);
* ``job_feedback`` / ``job_profiles``: a job's opt-in to the closed loop and the profile versions
  the loop fitted, each with the first step it applies to.

Every method blocks; call it off the event loop.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cachetools import LRUCache
from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Engine,
    Float,
    Integer,
    String,
    Text,
    func,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from api.errors import DatabaseUnavailable
from api.storage import as_utc, utcnow
from solver.schema import PlanRequest

RESOLVED_MEMO = 1024
"""Request bodies whose profile resolution is remembered (a few steps of many jobs)."""


class ProfileBase(DeclarativeBase):
    pass


def digest_of(data: Any) -> str:
    """SHA-256 of canonical JSON (sorted keys): equal content, equal digest."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ProfileRow(ProfileBase):
    __tablename__ = "profiles"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(32))
    body: Mapped[str] = mapped_column(Text, doc="The profile's JSON (its constants).")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class StepRequestRow(ProfileBase):
    __tablename__ = "step_requests"

    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    plan_id: Mapped[str] = mapped_column(String(300))
    profile_version: Mapped[int | None] = mapped_column(Integer)
    """The job's fitted profile version the plan was priced with (None: the request's own)."""
    request: Mapped[str] = mapped_column(Text)


class MeasurementRow(ProfileBase):
    __tablename__ = "measurements"

    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    digest: Mapped[str] = mapped_column(String(32))
    body: Mapped[str] = mapped_column(Text)
    step_time_ms: Mapped[float] = mapped_column(Float)
    all_to_all_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class JobFeedbackRow(ProfileBase):
    __tablename__ = "job_feedback"

    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean)
    config: Mapped[str] = mapped_column(Text)
    base_profile: Mapped[str | None] = mapped_column(Text, doc="Constants the loop starts from.")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class JobProfileRow(ProfileBase):
    __tablename__ = "job_profiles"

    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    from_step: Mapped[int] = mapped_column(BigInteger, doc="First step planned with it.")
    steps_used: Mapped[int] = mapped_column(Integer)
    error_before: Mapped[float] = mapped_column(Float)
    error_after: Mapped[float] = mapped_column(Float)
    body: Mapped[str] = mapped_column(Text, doc="The fitted profile's JSON.")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class StoredProfile:
    name: str
    version: int
    body: dict[str, Any]
    created_at: datetime


class ProfileStore:
    """Repository over the four tables."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self.resolved: LRUCache[str, tuple[PlanRequest, int | None] | None] = LRUCache(
            RESOLVED_MEMO
        )
        """The last resolution of each request body (by digest; None: the body itself), for
        replays during an outage."""

    # --- named profiles -----------------------------------------------------------------------
    def get_profile(self, name: str, version: int | None = None) -> StoredProfile | None:
        stmt = select(ProfileRow).where(ProfileRow.name == name)
        if version is not None:
            stmt = stmt.where(ProfileRow.version == version)
        stmt = stmt.order_by(ProfileRow.version.desc()).limit(1)
        with self._sessions() as session:
            row = session.scalars(stmt).first()
        if row is None:
            return None
        return StoredProfile(row.name, row.version, json.loads(row.body), as_utc(row.created_at))

    def put_profile(self, name: str, body: dict[str, Any]) -> tuple[StoredProfile, bool]:
        """Store ``body`` as the newest version unless it equals the newest; (stored, created).

        Writers of one name take turns (a PostgreSQL advisory lock on the name, SQLite's write
        lock taken up front), so concurrent PUTs get consecutive versions without conflicts.
        A PUT that cannot get its turn within the database's lock timeout is
        ``DatabaseUnavailable`` (503 + Retry-After) without counting as an outage."""
        digest = digest_of(body)
        for _ in range(PUT_ATTEMPTS):
            try:
                return self._put_profile_once(name, body, digest)
            except IntegrityError:  # another writer without the lock took the number: again
                continue
        raise DatabaseUnavailable(f"profile {name!r} is being written concurrently; retry later")

    def _put_profile_once(
        self, name: str, body: dict[str, Any], digest: str
    ) -> tuple[StoredProfile, bool]:
        newest = (
            select(ProfileRow)
            .where(ProfileRow.name == name)
            .order_by(ProfileRow.version.desc())
            .limit(1)
        )
        with self._sessions() as session:
            _take_profile_turn(session, name)
            current = session.scalars(newest).first()
            if current is not None and digest_of(json.loads(current.body)) == digest:
                unchanged = StoredProfile(
                    name, current.version, json.loads(current.body), as_utc(current.created_at)
                )
                return unchanged, False
            version = 1 if current is None else current.version + 1
            row = ProfileRow(
                name=name,
                version=version,
                digest=digest,
                body=json.dumps(body),
                created_at=utcnow(),
            )
            session.add(row)
            session.commit()
        return StoredProfile(name, version, body, as_utc(row.created_at)), True

    # --- step requests and measurements ---------------------------------------------------------
    def record_request(
        self, job_id: str, step: int, plan_id: str, request: str, version: int | None
    ) -> None:
        """Remember the request of a job step (first write wins: a replay changes nothing)."""
        row = StepRequestRow(
            job_id=job_id, step=step, plan_id=plan_id, profile_version=version, request=request
        )
        try:
            with self._sessions.begin() as session:
                session.add(row)
        except IntegrityError:
            pass

    def step_requests(self, job_id: str, steps: Sequence[int]) -> dict[int, StepRequestRow]:
        stmt = select(StepRequestRow).where(
            StepRequestRow.job_id == job_id, StepRequestRow.step.in_(list(steps))
        )
        with self._sessions() as session:
            return {r.step: r for r in session.scalars(stmt)}

    def max_planned_step(self, job_id: str) -> int | None:
        stmt = select(func.max(StepRequestRow.step)).where(StepRequestRow.job_id == job_id)
        with self._sessions() as session:
            value = session.execute(stmt).scalar()
        return None if value is None else int(value)

    def put_measurement(
        self, job_id: str, step: int, body: dict[str, Any]
    ) -> tuple[MeasurementRow, bool]:
        """Insert unless stored; (stored row, created). The caller compares digests (409)."""
        row = MeasurementRow(
            job_id=job_id,
            step=step,
            digest=digest_of(body),
            body=json.dumps(body, sort_keys=True),
            step_time_ms=float(body["step_time_ms"]),
            all_to_all_ms=body.get("all_to_all_ms"),
            created_at=utcnow(),
        )
        try:
            with self._sessions.begin() as session:
                session.add(row)
        except IntegrityError:
            with self._sessions() as session:
                stored = session.get(MeasurementRow, (job_id, step))
            if stored is None:
                raise
            return stored, False
        return row, True

    def measurements(
        self, job_id: str, limit: int, after: int | None = None
    ) -> Sequence[MeasurementRow]:
        """A job's measurements ordered by step (keyset-paginated with ``after``)."""
        stmt = select(MeasurementRow).where(MeasurementRow.job_id == job_id)
        if after is not None:
            stmt = stmt.where(MeasurementRow.step > after)
        stmt = stmt.order_by(MeasurementRow.step).limit(limit)
        with self._sessions() as session:
            return session.scalars(stmt).all()

    def latest_measurements(self, job_id: str, limit: int) -> Sequence[MeasurementRow]:
        stmt = (
            select(MeasurementRow)
            .where(MeasurementRow.job_id == job_id)
            .order_by(MeasurementRow.step.desc())
            .limit(limit)
        )
        with self._sessions() as session:
            return list(reversed(session.scalars(stmt).all()))

    def count_measurements(self, job_id: str) -> int:
        stmt = select(func.count()).where(MeasurementRow.job_id == job_id)
        with self._sessions() as session:
            return int(session.execute(stmt).scalar() or 0)

    # --- the closed loop ------------------------------------------------------------------------
    def get_feedback(self, job_id: str) -> JobFeedbackRow | None:
        with self._sessions() as session:
            return session.get(JobFeedbackRow, job_id)

    def put_feedback(
        self, job_id: str, enabled: bool, config: dict[str, Any], base: dict[str, Any] | None
    ) -> JobFeedbackRow:
        with self._sessions.begin() as session:
            row = session.get(JobFeedbackRow, job_id)
            if row is None:
                row = JobFeedbackRow(job_id=job_id)
                session.add(row)
            row.enabled = enabled
            row.config = json.dumps(config, sort_keys=True)
            row.base_profile = None if base is None else json.dumps(base, sort_keys=True)
            row.updated_at = utcnow()
        return row

    def job_profiles(self, job_id: str) -> Sequence[JobProfileRow]:
        stmt = (
            select(JobProfileRow)
            .where(JobProfileRow.job_id == job_id)
            .order_by(JobProfileRow.version)
        )
        with self._sessions() as session:
            return session.scalars(stmt).all()

    def job_profile_for_step(self, job_id: str, step: int) -> JobProfileRow | None:
        """The newest fitted version that applies to ``step`` (``from_step <= step``)."""
        stmt = (
            select(JobProfileRow)
            .where(JobProfileRow.job_id == job_id, JobProfileRow.from_step <= step)
            .order_by(JobProfileRow.version.desc())
            .limit(1)
        )
        with self._sessions() as session:
            return session.scalars(stmt).first()

    def add_job_profile(self, row: JobProfileRow) -> bool:
        """Store a fitted version; False when another refit took that version number first."""
        try:
            with self._sessions.begin() as session:
                session.add(row)
        except IntegrityError:
            return False
        return True


PUT_ATTEMPTS = 5
"""Tries of a profile PUT that lost its version number to a writer that took no turn."""
PROFILE_LOCK_CLASS = 0x7072
"""First key of the PostgreSQL advisory lock a profile's writers take turns on ("pr"); the
second is the name's hash. Two-key advisory locks never collide with the one-key migration lock."""
CONTENDED_SQLSTATES = frozenset({"55P03", "57014"})
"""PostgreSQL's lock timeout and statement timeout, while waiting for the turn."""


def _take_profile_turn(session: Session, name: str) -> None:
    """Wait, within the database's lock timeout, until no other writer of ``name`` is between
    reading the newest version and storing the next; held until the transaction ends."""
    dialect = session.get_bind().dialect.name
    try:
        if dialect == "postgresql":
            session.execute(
                text("SELECT pg_advisory_xact_lock(:cls, hashtext(:name))"),
                {"cls": PROFILE_LOCK_CLASS, "name": name},
            )
        elif dialect == "sqlite":
            # The write lock now, not at the INSERT: the read below is then of the newest
            # version (a plain BEGIN lets two writers read the same one).
            session.connection().exec_driver_sql("BEGIN IMMEDIATE")
    except OperationalError as exc:
        if not _contended(exc):
            raise
        raise DatabaseUnavailable(
            f"profile {name!r} is being written concurrently; retry later"
        ) from None


def _contended(exc: OperationalError) -> bool:
    """Whether ``exc`` is a lock wait that ran out of time (not a broken database)."""
    if getattr(exc.orig, "sqlstate", None) in CONTENDED_SQLSTATES:
        return True
    return "database is locked" in str(exc.orig)
