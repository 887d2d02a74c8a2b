"""Seeded traces of long-tailed sample lengths, and the one loader of scenario files.

A *trace* is a sequence of training steps; each step is a global batch of variable-length
samples planned by one ``PlanRequest``. The generator draws every batch the same way:

1. the **token budget** of a step is ``fill * world_size * max_tokens_per_rank``, a share of the
   cluster's activation memory (at most 1; the scenarios leave 30-45% headroom);
2. sample lengths are drawn i.i.d. from a **mixture**: with probability ``1 - tail_prob`` a
   lognormal *body* (median ``body_median``, log-space spread ``body_sigma``), else a *truncated
   Pareto tail* on ``[tail_min, max_length]`` with index ``tail_alpha``; every length is rounded
   and clipped to ``[min_length, max_length]``;
3. samples join the batch in draw order; one longer than what is left of the budget is skipped
   (it does not end the batch), and the batch closes when what is left is shorter than
   ``min_length`` or ``MAX_SKIPS`` draws in a row did not fit. A batch therefore fills its
   budget to within a few short samples, and a long sample is kept unless it arrives late.

With a ``loader`` section the batch is instead what a packing data loader emits (``PackedLoader``):
the loader fixes one parent size for the step, fills every parent, in arrival order, to at least
``min_fill`` of its ``P * max_tokens_per_rank`` and reports ``parent_sizes`` and ``parent_of``
with the lengths, so the planner sees memory-tight parents exactly as a real loader leaves them.

Each step's random stream is seeded by ``(seed, step)`` alone, so step 123 is the same batch
whether it is drawn alone, in order or in another process. ``load_trace`` reads a scenario YAML
(generator parameters + request fields), a directory of request files, or one request file, and
yields validated ``PlanRequest`` objects: the one way the CLI and the tests read scenarios.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from solver.io import load_document, read_request
from solver.schema import ClusterSpec, Mode, ModelSpec, PlanRequest, allowed_parent_sizes

DRAW_CHUNK = 1024
"""Lengths drawn per call to the generator; fixed, because the stream must not depend on it."""

MAX_SKIPS = 32
"""A step closes after this many consecutive draws that do not fit in what is left of it."""

SHIPPED_SCENARIOS = Path(__file__).resolve().parent / "scenarios"
"""Scenarios installed with the package, so that the CLI's defaults and the documented
``scenarios/...`` paths work outside the checkout. In the repository ``solver/scenarios`` is a
link to the top-level ``scenarios/`` (the one copy); a wheel holds the files themselves."""

REQUEST_SUFFIXES = (".json", ".yaml", ".yml")
"""Files of a request directory that are read, in sorted name order; others are ignored."""


MAX_BODY_MEDIAN = 2.0**31
"""Largest median of the lognormal body, in tokens (its draws stay finite at ``body_sigma`` 5)."""
MIN_TAIL_ALPHA, MAX_TAIL_ALPHA = 0.05, 20.0
"""Pareto indices whose inverse CDF stays finite for every length range (1e-300 overflowed)."""


class LengthDistribution(BaseModel):
    """Lognormal body + truncated Pareto tail, in tokens (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Bounded so that no draw overflows (a median of 1e308 printed numpy's overflow warnings
    # on stderr, 2026-12-07 fuzz): every length is clipped to max_length anyway.
    body_median: float = Field(
        1800.0, gt=0, le=MAX_BODY_MEDIAN, allow_inf_nan=False, description="Median of the body."
    )
    body_sigma: float = Field(
        1.0, ge=0, le=5, allow_inf_nan=False, description="Std-dev of log(length) in the body."
    )
    tail_prob: float = Field(
        0.001, ge=0, le=1, allow_inf_nan=False, description="Share of samples from the tail."
    )
    tail_min: StrictInt = Field(32768, ge=1, description="Shortest tail sample (Pareto scale).")
    tail_alpha: float = Field(
        1.0,
        ge=MIN_TAIL_ALPHA,
        le=MAX_TAIL_ALPHA,
        allow_inf_nan=False,
        description="Pareto index; smaller = heavier tail.",
    )
    min_length: StrictInt = Field(64, ge=1, description="Every length is at least this.")
    max_length: StrictInt = Field(
        524288, ge=1, description="Every length is at most this (tail truncation point)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> LengthDistribution:
        if self.min_length > self.max_length:
            raise ValueError(
                f"min_length ({self.min_length}) must be <= max_length ({self.max_length})"
            )
        if self.tail_min > self.max_length:
            raise ValueError(
                f"tail_min ({self.tail_min}) must be <= max_length ({self.max_length})"
            )
        return self

    def draw(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        """``n`` lengths; consumes a fixed amount of ``rng`` per call (three arrays of ``n``)."""
        in_tail = rng.random(n) < self.tail_prob
        body = self.body_median * np.exp(self.body_sigma * rng.standard_normal(n))
        tail = self._pareto(rng.random(n))
        lengths = np.where(in_tail, tail, body)
        return np.clip(np.rint(lengths), self.min_length, self.max_length).astype(np.int64)

    def _pareto(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        """Inverse CDF of the Pareto law on ``[tail_min, max_length]`` at uniforms ``u``."""
        lo, hi, a = float(self.tail_min), float(self.max_length), self.tail_alpha
        cut = 1.0 - (lo / hi) ** a  # CDF at the truncation point
        return lo * (1.0 - u * cut) ** (-1.0 / a)

    def mean_length(self) -> float:
        """Expected length before rounding and clipping (the mixture of the two means)."""
        body = self.body_median * math.exp(self.body_sigma**2 / 2)
        lo, hi, a = float(self.tail_min), float(self.max_length), self.tail_alpha
        if lo == hi:
            tail = lo
        elif a == 1.0:
            tail = lo * math.log(hi / lo) / (1.0 - lo / hi)
        else:
            tail = a * lo**a * (hi ** (1 - a) - lo ** (1 - a)) / ((1 - a) * (1 - (lo / hi) ** a))
        return (1.0 - self.tail_prob) * body + self.tail_prob * tail

    def tail_exceeds(self, length: float) -> float:
        """P(tail sample > ``length``): the share of tail samples longer than ``length``."""
        lo, hi, a = float(self.tail_min), float(self.max_length), self.tail_alpha
        if length < lo:
            return 1.0
        if length >= hi:
            return 0.0
        return (length**-a - hi**-a) / (lo**-a - hi**-a)

    def body_exceeds(self, length: float) -> float:
        """P(body sample > ``length``) before clipping."""
        if self.body_sigma == 0:
            return float(self.body_median > length)
        z = (math.log(length) - math.log(self.body_median)) / self.body_sigma
        return 0.5 * math.erfc(z / math.sqrt(2.0))

    def exceeds(self, length: float) -> float:
        """P(a sample is longer than ``length``), for ``min_length <= length < max_length``."""
        p = self.tail_prob
        return (1.0 - p) * self.body_exceeds(length) + p * self.tail_exceeds(length)


MAX_PACKING_DRAWS = 200_000
"""A packed step stops drawing after this many lengths even if a parent is still below its
fill (only reachable with distributions that have no short samples)."""


class PackedLoader(BaseModel):
    """A loader that packs every rank to its token budget, as real variable-length loaders do.

    Per step: lengths are drawn until the cluster's memory is covered; the parent size is the
    smallest allowed uniform size, at least ``min_parent_size``, that holds the longest of them
    within ``long_sample_share`` of a parent (the loader keeps room beside a long sample); then
    samples, in arrival order, go to the first parent with room (first fit), more are drawn
    until every parent holds at least ``min_fill`` of ``P * max_tokens_per_rank``, and samples
    that fit nowhere are dropped. The request carries ``parent_sizes`` and ``parent_of``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_fill: float = Field(
        0.99, gt=0, le=1, description="Least share of a parent's token capacity it is filled to."
    )
    min_parent_size: StrictInt = Field(8, ge=1, description="The loader's usual SP degree.")
    long_sample_share: float = Field(
        0.5, gt=0, le=1, description="Largest share of a parent the longest sample may take."
    )

    def pack(
        self,
        rng: np.random.Generator,
        lengths: LengthDistribution,
        allowed: list[int],
        cap: int,
        world: int,
    ) -> tuple[list[int], list[int], list[int]]:
        """``(lengths, parent_sizes, parent_of)`` of one step."""
        pool: list[int] = []
        while sum(pool) < world * cap:
            pool += lengths.draw(rng, DRAW_CHUNK).tolist()
        running = list(itertools.accumulate(pool))
        pool = pool[: bisect.bisect_left(running, world * cap) + 1]  # just covers the memory
        longest = max(pool)
        fitting = [p for p in allowed if p * cap >= longest]
        size = next(
            (
                p
                for p in fitting
                if p >= self.min_parent_size and longest <= self.long_sample_share * p * cap
            ),
            fitting[-1],
        )
        parents = world // size
        room = [size * cap] * parents
        target = size * cap - math.ceil(self.min_fill * size * cap)  # room left when full
        batch: list[int] = []
        parent_of: list[int] = []

        def offer(n: int) -> None:
            j = next((j for j in range(parents) if room[j] > target and room[j] >= n), None)
            if j is not None:
                batch.append(n)
                parent_of.append(j)
                room[j] -= n

        for n in pool:
            offer(n)
        drawn = 0
        while any(r > target for r in room) and drawn < MAX_PACKING_DRAWS:
            for n in lengths.draw(rng, DRAW_CHUNK).tolist():
                offer(n)
            drawn += DRAW_CHUNK
        return batch, [size] * parents, parent_of


class TraceSpec(BaseModel):
    """How a trace is generated: seed, number of steps, batch budget, length distribution."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: StrictInt = Field(0, ge=0, description="With the step, the only source of randomness.")
    steps: StrictInt = Field(100, ge=1, le=1_000_000, description="Steps in the trace.")
    first_step: StrictInt = Field(0, ge=0, description="Step number of the first step.")
    fill: float = Field(
        0.6, gt=0, le=1, description="Token budget per step as a share of cluster memory."
    )
    lengths: LengthDistribution = Field(default_factory=LengthDistribution)
    loader: PackedLoader | None = Field(
        None, description="Packed loader (parent_sizes/parent_of per step); fill is unused."
    )

    def budget(self, cluster: ClusterSpec) -> int:
        """Token budget of every step on ``cluster``."""
        return int(self.fill * cluster.world_size * cluster.max_tokens_per_rank)

    def step_lengths(self, step: int, cluster: ClusterSpec) -> list[int]:
        """The batch of ``step``: draws in order, skipping those that overflow the budget."""
        left = self.budget(cluster)
        rng = np.random.default_rng([self.seed, step])
        batch: list[int] = []
        skips = 0
        while left >= self.lengths.min_length and skips < MAX_SKIPS:
            for n in self.lengths.draw(rng, DRAW_CHUNK).tolist():
                if n <= left:
                    batch.append(n)
                    left -= n
                    skips = 0
                else:
                    skips += 1
                if left < self.lengths.min_length or skips >= MAX_SKIPS:
                    break
        return batch or [self.lengths.min_length]  # nothing fitted: the shortest sample

    def packed_step(
        self, step: int, cluster: ClusterSpec, model: ModelSpec
    ) -> tuple[list[int], list[int], list[int]]:
        """``(lengths, parent_sizes, parent_of)`` of ``step`` under the packed ``loader``."""
        assert self.loader is not None
        rng = np.random.default_rng([self.seed, step])
        allowed = allowed_parent_sizes(cluster, model)
        return self.loader.pack(
            rng, self.lengths, allowed, cluster.max_tokens_per_rank, cluster.world_size
        )


class Scenario(BaseModel):
    """A scenario file: request fields shared by every step, plus the trace generator."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    job_id: str = Field("trace", min_length=1, max_length=200)
    description: str | None = Field(None, description="Free text; not used by the planner.")
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    parent_sizes: list[StrictInt] | None = None
    mode: Mode | None = None
    deadline_ms: StrictInt | None = Field(None, gt=0, le=600_000)
    trace: TraceSpec

    @model_validator(mode="after")
    def _longest_fits(self) -> Scenario:
        widest = max(allowed_parent_sizes(self.cluster, self.model), default=0)
        cap = widest * self.cluster.max_tokens_per_rank
        if self.trace.lengths.max_length > cap:
            raise ValueError(
                f"trace.lengths.max_length = {self.trace.lengths.max_length} exceeds the widest "
                f"parent's capacity ({widest} ranks x {self.cluster.max_tokens_per_rank} = {cap})"
            )
        return self

    @model_validator(mode="after")
    def _loader_gives_sizes(self) -> Scenario:
        if self.trace.loader is not None and self.parent_sizes is not None:
            raise ValueError("parent_sizes: a trace.loader chooses the parent sizes itself")
        return self

    @model_validator(mode="after")
    def _budget_holds_a_sample(self) -> Scenario:
        budget, shortest = self.trace.budget(self.cluster), self.trace.lengths.min_length
        if budget < shortest:
            raise ValueError(
                f"trace.fill gives a budget of {budget} tokens, below trace.lengths.min_length "
                f"({shortest})"
            )
        return self

    def requests(self) -> Iterator[PlanRequest]:
        """One validated request per step, in step order."""
        for step in range(self.trace.first_step, self.trace.first_step + self.trace.steps):
            if self.trace.loader is not None:
                lengths, sizes, parent_of = self.trace.packed_step(step, self.cluster, self.model)
                yield PlanRequest(
                    job_id=self.job_id,
                    step=step,
                    cluster=self.cluster,
                    model=self.model,
                    lengths=lengths,
                    parent_sizes=sizes,
                    parent_of=parent_of,
                    mode=self.mode,
                    deadline_ms=self.deadline_ms,
                )
                continue
            yield PlanRequest(
                job_id=self.job_id,
                step=step,
                cluster=self.cluster,
                model=self.model,
                lengths=self.trace.step_lengths(step, self.cluster),
                parent_sizes=self.parent_sizes,
                mode=self.mode,
                deadline_ms=self.deadline_ms,
            )


def is_scenario(data: Any) -> bool:
    return isinstance(data, dict) and "trace" in data


def resolve_trace(path: str | Path) -> Path:
    """``path`` if it exists; else the shipped scenario it names (``gpu64-200steps``,
    ``gpu64-200steps.yaml`` or ``scenarios/gpu64-200steps.yaml``); else ``path`` unchanged, so
    that reading it reports the missing file the user typed."""
    path = Path(path)
    if path.exists() or path.is_absolute() or path.parent.name not in ("", "scenarios"):
        return path
    for candidate in (path.name, path.name + ".yaml"):
        shipped = SHIPPED_SCENARIOS / candidate
        if shipped.exists():
            return shipped
    return path


def load_trace(path: str | Path) -> Iterator[PlanRequest]:
    """Requests of a scenario YAML, a directory of request files, or a single request file.

    A file holding a ``trace`` key is a scenario; any other file is one request. A directory
    yields its ``*.json``/``*.yaml``/``*.yml`` requests in sorted name order; an error in one of
    them carries a note naming the file. A path that does not exist may name a shipped
    scenario (``resolve_trace``).
    """
    path = resolve_trace(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in REQUEST_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"{path}: no request files (*.json, *.yaml, *.yml)")
        for file in files:
            try:
                request = read_request(file)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                exc.add_note(f"in {file}")
                raise
            yield request
        return
    data = load_document(path)
    if is_scenario(data):
        yield from Scenario.model_validate(data).requests()
    else:
        yield PlanRequest.model_validate(data)


def request_bodies(path: str | Path, steps: int, job_id: str | None = None) -> list[dict[str, Any]]:
    """The first ``steps`` requests of a trace as JSON bodies (what a data loader posts),
    with ``job_id`` replaced when given and ``step`` numbered where a file has none; the demo
    and the service benchmark post these."""
    bodies = []
    for i, request in enumerate(itertools.islice(load_trace(path), steps)):
        body = request.model_dump(mode="json", exclude_none=True)
        if job_id is not None:
            body["job_id"] = job_id
        if "job_id" in body:
            body.setdefault("step", i)
        bodies.append(body)
    return bodies
