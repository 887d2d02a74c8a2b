"""Plan history in SQLAlchemy 2: the ``plans`` table, the ``plan_claims`` table, a repository
with blocking methods (``api/database.py`` runs them off the event loop with timeouts).

SQLite (a file, zero set-up) by default, PostgreSQL by URL. A stored plan is immutable: its
bytes are what every later request for the same key gets back, also after a restart. The
schema is owned by the Alembic migrations in ``api/migrations``; the classes below mirror it.

Keys live in two namespaces (``kind``): ``named`` plans are keyed by ``(job_id, step)``,
``anonymous`` plans by ``{mode}-{digest}``; the same ``plan_id`` string may exist in both.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

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
    delete,
    event,
    func,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DisconnectionError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, defer, mapped_column, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, NullPool

from solver.schema import Plan, PlanRequest

log = logging.getLogger("api.storage")

MAX_STEP = 2**63 - 1
"""Steps are stored as 64-bit integers (BIGINT); larger ones are refused at the edge."""

Kind = Literal["named", "anonymous"]


class Base(DeclarativeBase):
    pass


class PlanRow(Base):
    """One accepted plan; ``body`` is the exact JSON every replay returns. The metrics are
    copied into columns so that history queries never parse plan bodies."""

    __tablename__ = "plans"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_plans_job_step"),)

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
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
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class ClaimRow(Base):
    """A replica's claim to solve a key (cross-replica single flight); deleted when the plan
    is stored, ignored once ``expires_at`` has passed (its replica died mid-solve)."""

    __tablename__ = "plan_claims"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    plan_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class PlanKey:
    """Where a plan lives: its namespace and its id within it."""

    kind: Kind
    plan_id: str


@dataclass(frozen=True)
class StoredPlan:
    """What a replay needs: the request digest to compare and the bytes to send, and the job
    it belongs to (named or anonymous) so that deleting the job forgets it."""

    plan_id: str
    request_digest: str
    body: bytes
    job_id: str | None = None


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    steps: int
    first_step: int | None
    last_step: int | None
    mean_speedup: float
    last_created_at: datetime


@dataclass(frozen=True)
class DbTimeouts:
    """Client-side limits on every database wait, all shorter than a request's deadline."""

    connect_s: float
    """Opening a connection (libpq counts whole seconds, at least 2)."""
    statement_ms: int
    """A statement on the server (PostgreSQL ``statement_timeout``, ``lock_timeout``)."""
    pool_s: float
    """Waiting for a free pooled connection."""


DEFAULT_TIMEOUTS = DbTimeouts(connect_s=2.0, statement_ms=500, pool_s=0.5)
RETENTION_BATCH = 1000
"""Plans one retention statement deletes."""
GET_MANY_BATCH = 500
"""Ids in one ``IN`` list of ``get_many``."""
POOL_SIZE = 8
POOL_OVERFLOW = 8
POOL_CONNECTIONS = POOL_SIZE + POOL_OVERFLOW
"""Connections one process may open; the database executor has as many threads."""


def _make_engine(url: str, timeouts: DbTimeouts) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = create_engine(
            url,
            pool_pre_ping=True,
            pool_size=POOL_SIZE,
            max_overflow=POOL_OVERFLOW,
            pool_timeout=timeouts.pool_s,
            connect_args={
                "connect_timeout": max(2, round(timeouts.connect_s)),
                # A host that vanishes is noticed by the kernel within ~5 s, freeing the thread.
                "keepalives": 1,
                "keepalives_idle": 2,
                "keepalives_interval": 1,
                "keepalives_count": 3,
                "tcp_user_timeout": max(1000, timeouts.statement_ms * 4),
            },
        )

        @event.listens_for(engine, "connect")
        def _pg_timeouts(dbapi_conn: Any, _record: Any) -> None:
            ms = timeouts.statement_ms
            cur = dbapi_conn.cursor()
            cur.execute(f"SET statement_timeout = {ms}; SET lock_timeout = {ms}")
            cur.execute(f"SET idle_in_transaction_session_timeout = {ms * 10}")
            cur.close()
            dbapi_conn.commit()

        return engine
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": _busy_s(timeouts)}
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        _sqlite_setup(dbapi_conn)

    return engine


def _busy_s(timeouts: DbTimeouts) -> float:
    return max(0.05, timeouts.statement_ms / 1e3)


def _sqlite_setup(dbapi_conn: Any) -> None:
    # WAL lets readers (replays, dashboard) run while a plan is written. synchronous=NORMAL
    # in WAL mode survives any crash or restart of the service (the WAL is fsynced at
    # checkpoints); only an OS crash or power loss can drop the last commits. It takes the
    # ~5 ms fsync off every new plan.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


class DatabaseFileGone(OSError):
    """The SQLite file this process opened is no longer at its path (deleted, moved, or
    replaced by a file that cannot be used): a database fault (503, not ready)."""


FileId = tuple[int, int]
"""``(st_dev, st_ino)``: which file a path names."""
SWITCH_RETRY_S = 1.0
"""A file at the path that could not be migrated is tried again after this long."""


def _file_id(path: str) -> FileId | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino)


class SqliteFile:
    """Keeps an SQLite store on the file its path names.

    SQLite keeps using a file that was unlinked or renamed away: writes would land in a file
    that nobody can open again, while new connections would make an empty one at the path.
    So once the store is open, every connection checkout and every commit compares the path's
    ``(st_dev, st_ino)`` with the file in use (one ``stat``, ~1 us), connections open the path
    without creating it (``mode=rw``), and:

    * no file at the path: ``DatabaseFileGone`` (503; ``/readyz`` not ready), logged once;
    * another file at the path (a backup put back, an empty file made to start over): it is
      migrated to the newest revision and used from then on (``generation`` counts these
      switches); connections to the old file are closed as they come up.
    """

    def __init__(self, path: str, busy_s: float) -> None:
        self.path = os.path.abspath(path)
        self.busy_s = busy_s
        self.current: FileId | None = None
        """The file in use; None until the store is open (start-up may create the file)."""
        self._fd: int | None = None
        """A read-only descriptor of the file in use, never locked: while it is open the
        file's inode cannot be freed, so no file made later at the path can have its number.
        Closed only when the store moves to another file (closing a descriptor drops the
        process's POSIX locks on that file, which by then only stale connections hold)."""
        self.generation = 0
        self._lock = threading.Lock()
        self._gone_logged = False
        self._failed: tuple[FileId, float] | None = None

    def install(self, engine: Engine) -> None:
        event.listen(engine, "do_connect", self._do_connect)
        event.listen(engine, "connect", self._on_connect)
        event.listen(engine, "checkout", self._on_checkout)
        event.listen(engine, "commit", self._on_commit)

    def opened(self) -> None:
        """The store is open (migrated): from now on the path must keep naming this file."""
        self.close()
        self._fd, self.current = _pin(self.path)

    def close(self) -> None:
        """Unpin the file (after the store's connections are closed)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _uri(self) -> str:
        return f"file:{quote(self.path)}?mode=rw"

    def _do_connect(
        self, _dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]
    ) -> None:
        if self.current is not None:  # never create a file where ours was
            cargs[0] = self._uri()
            cparams["uri"] = True

    def _on_connect(self, _dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        record.info["sqlite_file"] = _file_id(self.path)

    def _on_checkout(self, _dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        if self.current is None:
            return
        now = self._check()
        if record.info.get("sqlite_file") != now:  # opened on a file that is gone: reopen
            raise DisconnectionError("connection to a replaced SQLite file")

    def _on_commit(self, conn: Connection) -> None:
        if self.current is None:
            return
        now = self._check()
        if conn.connection.info.get("sqlite_file") != now:
            raise DatabaseFileGone(f"{self.path} was replaced during the transaction")

    def _check(self) -> FileId:
        """The file in use, after switching to the one the path names now if it changed."""
        now = _file_id(self.path)
        if now is None:
            if not self._gone_logged:
                self._gone_logged = True
                log.error(
                    "the SQLite database %s was deleted or moved while the service runs: "
                    "answering 503 (not ready) until a database file is at that path again "
                    "(put a backup back, or create an empty file or restart to start a new "
                    "history); that file is then migrated and used",
                    self.path,
                )
            raise DatabaseFileGone(f"{self.path} is gone (deleted or moved)")
        if now != self.current:
            self._switch(now)
        elif self._gone_logged:  # moved back: the same file as before
            self._gone_logged = False
            log.warning("the SQLite database %s is back at its path", self.path)
        return now

    def _switch(self, now: FileId) -> None:
        with self._lock:
            if self.current == now:  # another thread switched meanwhile
                return
            failed = self._failed
            if failed and failed[0] == now and time.monotonic() - failed[1] < SWITCH_RETRY_S:
                raise DatabaseFileGone(f"{self.path} is not a usable database")
            try:
                fd, pinned = _pin(self.path)
            except OSError:
                raise DatabaseFileGone(f"{self.path} is gone (deleted or moved)") from None
            try:
                if pinned != now:
                    raise DatabaseFileGone(f"{self.path} changed again while it was opened")
                self._migrate()
            except (SQLAlchemyError, sqlite3.Error, OSError) as exc:
                os.close(fd)
                if isinstance(exc, DatabaseFileGone):
                    raise
                self._failed = (now, time.monotonic())
                log.error("the file now at %s cannot be used as the database: %s", self.path, exc)
                raise DatabaseFileGone(f"{self.path} is not a usable database") from None
            old, self._fd = self._fd, fd
            self.current, self._failed, self._gone_logged = now, None, False
            self.generation += 1
            if old is not None:
                os.close(old)
            log.warning(
                "the SQLite database %s is another file now: migrated it and using it "
                "(plans of the previous file are not in it)",
                self.path,
            )

    def _migrate(self) -> None:
        from api.migrate import upgrade

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(
                self._uri(), uri=True, timeout=self.busy_s, check_same_thread=False
            )
            _sqlite_setup(conn)
            return conn

        engine = create_engine("sqlite://", creator=connect, poolclass=NullPool)
        try:
            upgrade(engine)
        finally:
            engine.dispose()


def _pin(path: str) -> tuple[int, FileId]:
    """A read-only descriptor of the file at ``path`` and that file's identity."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def sqlite_file(url: str, timeouts: DbTimeouts) -> SqliteFile | None:
    """The file guard of an SQLite file URL (None for PostgreSQL, ``:memory:`` and URI
    filenames, which name no plain path)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.query.get("uri"):
        return None
    if not parsed.database or parsed.database == ":memory:":
        return None
    return SqliteFile(parsed.database, _busy_s(timeouts))


def _storable(value: str) -> bool:
    """PostgreSQL text cannot hold NUL; such a key cannot be stored, so it is never found."""
    return "\x00" not in value


class PlanStore:
    """Repository over ``plans`` and ``plan_claims``; every method blocks."""

    def __init__(self, url: str, timeouts: DbTimeouts = DEFAULT_TIMEOUTS) -> None:
        self.url = url
        self.engine = _make_engine(url, timeouts)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.file = sqlite_file(url, timeouts)
        if self.file is not None:
            self.file.install(self.engine)

    @property
    def generation(self) -> int:
        """Counts the times the database became another one under this store (an SQLite file
        replaced at its path); memories of stored rows must be dropped when it changes."""
        return 0 if self.file is None else self.file.generation

    def migrate(self) -> None:
        """Bring the schema to the newest migration (``api/migrate.py``); an SQLite file's
        path is watched from then on (``SqliteFile``)."""
        from api.migrate import upgrade

        upgrade(self.engine)
        if self.file is not None:
            self.file.opened()

    def close(self) -> None:
        self.engine.dispose()
        if self.file is not None:
            self.file.close()

    def ping(self) -> None:
        """Raise unless the database answers a trivial query."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def get(self, plan_id: str) -> StoredPlan | None:
        """The plan with this id; a named plan wins over an anonymous one with the same id."""
        if not _storable(plan_id):
            return None
        stmt = (
            select(PlanRow.plan_id, PlanRow.request_digest, PlanRow.body, PlanRow.job_id)
            .where(PlanRow.plan_id == plan_id)
            .order_by(PlanRow.kind.desc())  # 'named' > 'anonymous'
            .limit(1)
        )
        with self.engine.connect() as conn:  # Core, not a Session: this is the replay path
            row = conn.execute(stmt).first()
        return None if row is None else StoredPlan(row[0], row[1], row[2].encode(), row[3])

    def get_many(self, plan_ids: Sequence[str]) -> dict[str, StoredPlan]:
        """``get`` of many ids in a few statements: the plans found, by id."""
        wanted = sorted({p for p in plan_ids if _storable(p)})
        found: dict[str, tuple[str, StoredPlan]] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(wanted), GET_MANY_BATCH):
                stmt = select(
                    PlanRow.kind,
                    PlanRow.plan_id,
                    PlanRow.request_digest,
                    PlanRow.body,
                    PlanRow.job_id,
                ).where(PlanRow.plan_id.in_(wanted[i : i + GET_MANY_BATCH]))
                for kind, plan_id, digest, body, job_id in conn.execute(stmt):
                    if plan_id not in found or kind > found[plan_id][0]:  # named wins
                        found[plan_id] = (kind, StoredPlan(plan_id, digest, body.encode(), job_id))
        return {plan_id: stored for plan_id, (_kind, stored) in found.items()}

    def get_key(self, key: PlanKey) -> StoredPlan | None:
        with self.engine.connect() as conn:
            return _stored_at(conn, key)

    def get_row(self, plan_id: str) -> PlanRow | None:
        if not _storable(plan_id):
            return None
        stmt = select(PlanRow).where(PlanRow.plan_id == plan_id).order_by(PlanRow.kind.desc())
        with self._sessions() as session:
            return session.scalars(stmt.limit(1)).first()

    def claim(
        self,
        key: PlanKey,
        owner: str,
        expires_at: datetime,
        orphaned: Callable[[str], bool] = lambda _owner: False,
    ) -> StoredPlan | bool:
        """Claim ``key`` for solving: the stored plan if there is one, True if the claim is
        ours now, False if another live claim holds it.

        A live claim whose owner ``orphaned`` accepts is taken over: the caller knows that no
        request holds it (its own process wrote it for a request that already gave up).
        ``orphaned`` runs on the calling thread.

        The plan is looked for after the claim is written, not before: its writer deletes its
        claim in the transaction that stores the plan, so a claim that succeeds because the
        other one just went must still find that plan (and give the claim back).
        """
        try:
            with self._sessions.begin() as session:
                session.execute(
                    delete(ClaimRow).where(
                        ClaimRow.kind == key.kind,
                        ClaimRow.plan_id == key.plan_id,
                        ClaimRow.expires_at < utcnow(),
                    )
                )
                session.add(ClaimRow(kind=key.kind, plan_id=key.plan_id, owner=owner,
                                     expires_at=expires_at))  # fmt: skip
        except IntegrityError:
            if not self._take_over(key, owner, expires_at, orphaned):
                stored = self.get_key(key)
                return False if stored is None else stored
        stored = self.get_key(key)
        if stored is not None:
            self.release(key, owner)
            return stored
        return True

    def _take_over(
        self, key: PlanKey, owner: str, expires_at: datetime, orphaned: Callable[[str], bool]
    ) -> bool:
        """Make the key's claim ours if its owner is orphaned (compare and set on the owner,
        so that a claim replaced or deleted meanwhile is left alone)."""
        where = (ClaimRow.kind == key.kind, ClaimRow.plan_id == key.plan_id)
        with self._sessions.begin() as session:
            held = session.scalar(select(ClaimRow.owner).where(*where))
            if held is None or not orphaned(held):
                return False
            result = session.execute(
                update(ClaimRow)
                .where(*where, ClaimRow.owner == held)
                .values(owner=owner, expires_at=expires_at)
            )
        return int(result.rowcount or 0) == 1  # type: ignore[attr-defined]

    def release(self, key: PlanKey, owner: str) -> None:
        """Give up our claim (the solve failed); another request may claim the key now."""
        with self._sessions.begin() as session:
            _delete_claim(session, key, owner)

    def insert(self, row: PlanRow, owner: str | None = None) -> StoredPlan:
        """Store ``row`` unless its key exists (and drop ``owner``'s claim on it); either way
        return what is stored now."""
        key = PlanKey(row.kind, row.plan_id)  # type: ignore[arg-type]
        try:
            with self._sessions.begin() as session:
                session.add(row)
                session.flush()
                if owner is not None:
                    _delete_claim(session, key, owner)
        except IntegrityError:
            if owner is not None:
                self.release(key, owner)
            stored = self.get_key(key)
            if stored is None:  # the same (job_id, step) under another plan_id: impossible
                raise
            return stored
        return StoredPlan(row.plan_id, row.request_digest, row.body.encode(), row.job_id)

    def delete_job(self, job_id: str) -> int:
        """Delete every plan of ``job_id``; the number deleted."""
        if not _storable(job_id):
            return 0
        with self._sessions.begin() as session:
            result = session.execute(delete(PlanRow).where(PlanRow.job_id == job_id))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

    def delete_older_than(self, cutoff: datetime, batch: int = RETENTION_BATCH) -> int:
        """Retention: delete up to ``batch`` plans created before ``cutoff`` (oldest first, by
        the created_at index) and stale claims; the number of plans deleted. Small batches keep
        every statement within the statement timeout; call again until it returns 0."""
        oldest = (
            select(PlanRow.kind, PlanRow.plan_id)
            .where(PlanRow.created_at < cutoff)
            .order_by(PlanRow.created_at)
            .limit(batch)
        )
        with self._sessions.begin() as session:
            result = session.execute(
                delete(PlanRow).where(tuple_(PlanRow.kind, PlanRow.plan_id).in_(oldest))
            )
            session.execute(delete(ClaimRow).where(ClaimRow.expires_at < cutoff))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

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
            if not _storable(after):
                return []
            stmt = stmt.where(PlanRow.job_id > after)
        with self._sessions() as session:
            rows = session.execute(stmt).all()
        return [JobSummary(r[0], r[1], r[2], r[3], float(r[4]), as_utc(r[5])) for r in rows]

    def has_job(self, job_id: str) -> bool:
        """Whether any plan (with a step or not) carries ``job_id``: the jobs list shows such a
        job, so its steps page must exist even when none of its plans has a step."""
        if not _storable(job_id):
            return False
        stmt = select(PlanRow.plan_id).where(PlanRow.job_id == job_id).limit(1)
        with self._sessions() as session:
            return session.execute(stmt).first() is not None

    def list_steps(self, job_id: str, after: int | None, limit: int) -> Sequence[PlanRow]:
        """A job's plans ordered by step, keyset-paginated (``after`` = last step seen)."""
        if not _storable(job_id):
            return []
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


def _stored_at(conn: Any, key: PlanKey) -> StoredPlan | None:
    if not _storable(key.plan_id):
        return None
    stmt = select(PlanRow.plan_id, PlanRow.request_digest, PlanRow.body, PlanRow.job_id).where(
        PlanRow.kind == key.kind, PlanRow.plan_id == key.plan_id
    )
    row = conn.execute(stmt).first()
    return None if row is None else StoredPlan(row[0], row[1], row[2].encode(), row[3])


def _delete_claim(session: Session, key: PlanKey, owner: str) -> None:
    session.execute(
        delete(ClaimRow).where(
            ClaimRow.kind == key.kind, ClaimRow.plan_id == key.plan_id, ClaimRow.owner == owner
        )
    )


def key_of(request: PlanRequest, plan_id: str) -> PlanKey:
    """Named when the request carries ``(job_id, step)``, anonymous otherwise."""
    named = request.job_id is not None and request.step is not None
    return PlanKey("named" if named else "anonymous", plan_id)


def plan_row(request: PlanRequest, digest: str, plan: Plan, body: str) -> PlanRow:
    """The row that stores ``plan`` (serialised as ``body``) for ``request``."""
    m = plan.metrics
    return PlanRow(
        kind=key_of(request, plan.plan_id).kind,
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
