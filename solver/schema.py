"""Plan contract v1: the one definition of PlanRequest and Plan.

The API, the CLI and the runtime client all import these models; nothing else defines the wire
format. Every check that can be made without solving lives here, as a field validator, so that a
bad request fails with an error located at the offending field (``loc``), whether it came over
HTTP, from a scenario file or from Python.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from solver.input_limits import few_unknown_keys, integers_only
from solver.profiles import (
    CLUSTER_DEFAULTS,
    CLUSTER_PROFILES,
    MAX_TOKENS_PER_RANK_LIMIT,
    MODEL_DEFAULTS,
    MODEL_PROFILES,
    PROFILE_NAME_PATTERN,
    Bandwidth,
    Efficiency,
    PositiveTflops,
    Profile,
)

MAX_SAMPLES = 1_000_000
"""Largest batch a request may carry; bigger ones are rejected, not truncated."""
MAX_DEADLINE_MS = 600_000
"""Longest deadline a request may give (ten minutes): the CLI's ``--deadline-ms`` too."""

_NOT_IN_JOB_ID = r"\x00-\x1f\x7f-\x9f/\u200B-\u200F\u2028-\u202E\u2060-\u206F\uFEFF\uFFFD"
JOB_ID_PATTERN = (
    rf"^(?:[^{_NOT_IN_JOB_ID}.]|\.[^{_NOT_IN_JOB_ID}.]|\.\.[^{_NOT_IN_JOB_ID}])"
    rf"[^{_NOT_IN_JOB_ID}]*$"
)
"""A job id is a path segment and a database string: no control characters (NUL included),
no ``/``, and not ``.`` or ``..``, which a browser resolves away in a path (even percent-encoded),
so such a job's pages could not be reached; and no U+FFFD, which is what undecodable bytes in
a URL become (``%ff%fe`` named the same job as ``%fe%ff``); nor C1 controls or invisible
format characters (zero-width spaces, bidirectional overrides such as U+202E, a BOM), with
which two ids that read the same on the dashboard are different jobs. Written without
lookahead, which pydantic's regex engine lacks."""

CHILD_SIZES = (1, 2, 4, 8)
"""Sizes a node-local child may have (docs/design.md section 3, rule 2)."""

Mode = Literal["baseline", "sizing", "repack", "repack+parent", "repack+sizing"]
"""``sizing`` (an addition to v1) is heterogeneous parent sizes without repacking, the
FlexSP-style comparison point for ``repack+sizing``."""
Status = Literal["optimal", "feasible"]
StoppedBy = Literal["optimal", "deadline", "work_limit", "greedy"]

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]

# Plausible model sizes: each well beyond today's largest models, so that every accepted
# request keeps the cost model's numbers finite (ranges of the cluster's physical constants
# live beside the defaults, in solver/profiles.py).
MAX_LAYERS = 100_000
MAX_HIDDEN = 1 << 20
MAX_HEADS = 1 << 12
MAX_HEAD_DIM = 1 << 12
MAX_WINDOW = 1 << 24
MAX_MOE_ACTIVE_PARAMS = 1e13


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _merge_profile(data: Any, profiles: dict[str, dict[str, Any]], kind: str) -> Any:
    """Expand ``"name"`` or ``{"profile": "name", ...overrides}`` into explicit fields."""
    if isinstance(data, str):
        data = {"profile": data}
    if not isinstance(data, dict) or data.get("profile") is None:
        return data  # no profile named: plain fields (a dumped model carries profile=None)
    name = data["profile"]
    if not isinstance(name, str) or name not in profiles:
        known = ", ".join(sorted(profiles))
        raise ValueError(f"unknown {kind} profile {name!r}; known profiles: {known}")
    merged = dict(profiles[name])
    merged.update({k: v for k, v in data.items() if k != "profile"})
    merged["profile"] = name
    return merged


class ClusterSpec(BaseModel):
    """The machine: nodes of ``gpus_per_node`` ranks, link speeds, compute rate, memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = None
    nodes: StrictInt = Field(
        CLUSTER_DEFAULTS["nodes"], ge=1, le=4096, description="Number of nodes."
    )
    gpus_per_node: StrictInt = Field(
        CLUSTER_DEFAULTS["gpus_per_node"], ge=1, le=64, description="Ranks per node (power of 2)."
    )
    intra_node_gbps: Bandwidth = Field(
        CLUSTER_DEFAULTS["intra_node_gbps"], description="All-to-all GB/s inside a node."
    )
    inter_node_gbps: Bandwidth = Field(
        CLUSTER_DEFAULTS["inter_node_gbps"], description="All-to-all GB/s across nodes."
    )
    peak_tflops: PositiveTflops = Field(
        CLUSTER_DEFAULTS["peak_tflops"], description="Peak dense TFLOP/s per GPU."
    )
    compute_efficiency: Efficiency = Field(
        CLUSTER_DEFAULTS["compute_efficiency"],
        description="Achieved share of peak (every part; a profile can set one per part).",
    )
    max_tokens_per_rank: StrictInt = Field(
        CLUSTER_DEFAULTS["max_tokens_per_rank"],
        ge=1,
        le=MAX_TOKENS_PER_RANK_LIMIT,
        description="Activation memory limit in tokens per rank.",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_profile(cls, data: Any) -> Any:
        return _merge_profile(data, CLUSTER_PROFILES, "cluster")

    @field_validator("gpus_per_node")
    @classmethod
    def _gpus_power_of_two(cls, v: int) -> int:
        if not is_power_of_two(v):
            raise ValueError(f"must be a power of two, got {v}")
        return v

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class ModelSpec(BaseModel):
    """The hybrid-attention model: layer pattern, attention shape, MoE size, dtype."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    profile: str | None = None
    layers: StrictInt = Field(MODEL_DEFAULTS["layers"], ge=1, le=MAX_LAYERS)
    pattern: str = Field(
        MODEL_DEFAULTS["pattern"],
        min_length=1,
        max_length=64,
        description="Repeating layer pattern: F = full attention, S = sparse (windowed).",
    )
    hidden: StrictInt = Field(MODEL_DEFAULTS["hidden"], ge=1, le=MAX_HIDDEN)
    heads: StrictInt = Field(MODEL_DEFAULTS["heads"], ge=1, le=MAX_HEADS)
    kv_heads: StrictInt = Field(MODEL_DEFAULTS["kv_heads"], ge=1, le=MAX_HEADS)
    head_dim: StrictInt = Field(MODEL_DEFAULTS["head_dim"], ge=1, le=MAX_HEAD_DIM)
    sparse_window: StrictInt = Field(MODEL_DEFAULTS["sparse_window"], ge=1, le=MAX_WINDOW)
    moe_active_params: FiniteFloat = Field(
        MODEL_DEFAULTS["moe_active_params"],
        ge=0,
        le=MAX_MOE_ACTIVE_PARAMS,
        description="Active MoE parameters per layer per token.",
    )
    dtype_bytes: StrictInt = Field(MODEL_DEFAULTS["dtype_bytes"], ge=1, le=8)

    @model_validator(mode="before")
    @classmethod
    def _expand_profile(cls, data: Any) -> Any:
        return _merge_profile(data, MODEL_PROFILES, "model")

    @field_validator("pattern")
    @classmethod
    def _pattern_letters(cls, v: str) -> str:
        if set(v) - {"F", "S"}:
            raise ValueError(f"must contain only 'F' and 'S', got {v!r}")
        return v

    @field_validator("kv_heads")
    @classmethod
    def _kv_divides_heads(cls, v: int, info: ValidationInfo) -> int:
        heads = info.data.get("heads")
        if heads is not None and (v > heads or heads % v != 0):
            raise ValueError(f"must divide heads ({heads}), got {v}")
        return v

    @property
    def full_layers(self) -> int:
        """Layers whose pattern letter is F when the pattern repeats over ``layers``."""
        reps, rest = divmod(self.layers, len(self.pattern))
        return reps * self.pattern.count("F") + self.pattern[:rest].count("F")

    @property
    def sparse_layers(self) -> int:
        return self.layers - self.full_layers


def parent_size_error(size: int, start: int, cluster: ClusterSpec, model: ModelSpec) -> str | None:
    """Why a parent of ``size`` ranks starting at ``start`` is not allowed, or None."""
    g = cluster.gpus_per_node
    if not is_power_of_two(size):
        return f"parent size {size} is not a power of two"
    if start % min(size, g) != 0 or (size > g and start % g != 0):
        return f"parent of size {size} at rank {start} is not aligned"
    if model.heads % size != 0:
        return f"parent size {size} does not divide heads ({model.heads})"
    kv = model.kv_heads
    if (kv < size and size % kv != 0) or (kv >= size and kv % size != 0):
        return f"parent size {size} is incompatible with kv_heads ({kv})"
    return None


def allowed_parent_sizes(cluster: ClusterSpec, model: ModelSpec, uniform: bool = True) -> list[int]:
    """Power-of-two parent sizes allowed by the model, ascending; with ``uniform``, only those
    that tile the cluster on their own."""
    sizes = []
    size = 1
    while size <= cluster.world_size:
        tiles = cluster.world_size % size == 0 or not uniform
        if tiles and parent_size_error(size, 0, cluster, model) is None:
            sizes.append(size)
        size *= 2
    return sizes


class PlanRequest(BaseModel):
    """What the data loader sends each step (contract v1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    job_id: str | None = Field(None, min_length=1, max_length=200, pattern=JOB_ID_PATTERN)
    step: StrictInt | None = Field(None, ge=0)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    lengths: list[StrictInt] = Field(
        ..., min_length=1, max_length=MAX_SAMPLES, description="Tokens per sample (id = index)."
    )
    parent_sizes: list[StrictInt] | None = Field(
        None, min_length=1, description="Parent sizes in rank order; derived when absent."
    )
    parent_of: list[StrictInt] | None = Field(
        None, description="Upstream parent index of each sample (needs parent_sizes)."
    )
    mode: Mode | None = Field(
        None, description="Default: repack+sizing without parent_sizes, else repack+parent."
    )
    deadline_ms: StrictInt | None = Field(
        None,
        gt=0,
        le=MAX_DEADLINE_MS,
        description="Deadline of the answer: sets the deterministic work budget (full at the "
        "default 1000 ms and above, less below) and the wall-clock safety net.",
    )
    profile: Profile | None = Field(
        None,
        description="Cost-model constants to plan with; when given, they replace the "
        "cluster's peak_tflops, compute_efficiency and bandwidths.",
    )
    profile_name: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=PROFILE_NAME_PATTERN,
        description="A profile stored in the service, which fills `profile` from it; the "
        "solver alone plans only inline profiles.",
    )

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_keys(cls, data: Any) -> Any:
        few_unknown_keys(data, cls.model_fields)
        if isinstance(data, dict):
            for name, spec in (("cluster", ClusterSpec), ("model", ModelSpec)):
                few_unknown_keys(data.get(name), [*spec.model_fields, "profile"], name)
            few_unknown_keys(data.get("profile"), Profile.model_fields, "profile")
        return data

    @field_validator("lengths", "parent_sizes", "parent_of", mode="before")
    @classmethod
    def _integers_only(cls, v: Any, info: ValidationInfo) -> Any:
        return integers_only(v, str(info.field_name))

    @field_validator("step")
    @classmethod
    def _step_needs_job(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and "job_id" in info.data and info.data["job_id"] is None:
            raise ValueError("step requires job_id (together they are the idempotency key)")
        return v

    @field_validator("lengths")
    @classmethod
    def _lengths_fit(cls, v: list[int], info: ValidationInfo) -> list[int]:
        bad = next((i for i, n in enumerate(v) if n < 1), None)
        if bad is not None:
            raise ValueError(f"lengths[{bad}] = {v[bad]} must be >= 1")
        cluster, model = info.data.get("cluster"), info.data.get("model")
        if cluster is None or model is None:
            return v
        widest = max(allowed_parent_sizes(cluster, model), default=0)
        cap = widest * cluster.max_tokens_per_rank
        longest = max(v)
        if longest > cap:
            i = v.index(longest)
            raise ValueError(
                f"lengths[{i}] = {longest} exceeds the widest parent's capacity "
                f"({widest} ranks x {cluster.max_tokens_per_rank} tokens = {cap})"
            )
        total, room = sum(v), cluster.world_size * cluster.max_tokens_per_rank
        if total > room:
            raise ValueError(f"total tokens {total} exceed the cluster's capacity {room}")
        return v

    @field_validator("parent_sizes")
    @classmethod
    def _parents_tile(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        cluster, model = info.data.get("cluster"), info.data.get("model")
        if v is None or cluster is None or model is None:
            return v
        start = 0
        for j, size in enumerate(v):
            if size < 1:
                raise ValueError(f"parent_sizes[{j}] = {size} must be >= 1")
            why = parent_size_error(size, start, cluster, model)
            if why is not None:
                raise ValueError(f"parent_sizes[{j}]: {why}")
            start += size
        if start != cluster.world_size:
            raise ValueError(
                f"parent sizes sum to {start}, must tile the cluster's {cluster.world_size} ranks"
            )
        lengths = info.data.get("lengths")
        if lengths:
            cap = max(v) * cluster.max_tokens_per_rank
            longest = max(lengths)
            if longest > cap:
                raise ValueError(
                    f"the widest parent ({max(v)} ranks) holds {cap} tokens, "
                    f"shorter than the longest sample ({longest})"
                )
        return v

    @field_validator("parent_of")
    @classmethod
    def _membership_fits(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if v is None:
            return v
        if "parent_sizes" not in info.data:
            return v  # parent_sizes already failed; its error is reported
        sizes = info.data.get("parent_sizes")
        if sizes is None:
            raise ValueError("parent_of requires parent_sizes")
        lengths = info.data.get("lengths")
        if lengths is None:
            return v
        if len(v) != len(lengths):
            raise ValueError(f"has {len(v)} entries, lengths has {len(lengths)}")
        load = [0] * len(sizes)
        for i, p in enumerate(v):
            if not 0 <= p < len(sizes):
                raise ValueError(
                    f"parent_of[{i}] = {p} is not a parent index (0..{len(sizes) - 1})"
                )
            load[p] += lengths[i]
        cluster = info.data.get("cluster")
        if cluster is not None:
            for j, tokens in enumerate(load):
                cap = sizes[j] * cluster.max_tokens_per_rank
                if tokens > cap:
                    raise ValueError(f"parent {j} is given {tokens} tokens, more than its {cap}")
        return v

    @field_validator("profile_name")
    @classmethod
    def _names_agree(cls, v: str | None, info: ValidationInfo) -> str | None:
        inline = info.data.get("profile")
        if v is not None and inline is not None and inline.name != v:
            raise ValueError(
                f"names profile {v!r} but the inline profile is {inline.name!r}; give one of them"
            )
        return v

    @property
    def cost_profile(self) -> Profile:
        """The constants this request is planned with: the inline profile, else the cluster's
        own (one efficiency for every part, no per-collective latency)."""
        if self.profile is not None:
            return self.profile
        c = self.cluster
        return Profile(
            name=c.profile or "cluster",
            peak_tflops=c.peak_tflops,
            efficiency_full_attention=c.compute_efficiency,
            efficiency_sparse_attention=c.compute_efficiency,
            efficiency_linear=c.compute_efficiency,
            intra_node_gbps=c.intra_node_gbps,
            inter_node_gbps=c.inter_node_gbps,
        )

    @property
    def resolved_mode(self) -> Mode:
        if self.mode is not None:
            return self.mode
        return "repack+sizing" if self.parent_sizes is None else "repack+parent"


class ParentOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    ranks: list[int] = Field(..., min_length=2, max_length=2, description="[start, end)")
    samples: list[int]


class ChildOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    parent: int
    node: int
    ranks: list[int] = Field(..., min_length=2, max_length=2, description="[start, end)")
    samples: list[int]


class SplitSizes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_split_sizes: list[list[int]]
    output_split_sizes: list[list[int]]


class AllToAll(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to_full: SplitSizes
    to_child: SplitSizes


class Metrics(BaseModel):
    """Predicted quality of a plan under the cost model; optional fields may be absent in
    hand-written plans (the contract example) but the planner always fills them."""

    model_config = ConfigDict(extra="allow")

    step_time_ms: float
    baseline_step_time_ms: float
    speedup: float
    mfu: float
    baseline_mfu: float
    imbalance: float | None = None
    inter_node_bytes: float | None = None
    lower_bound_ms: float | None = None
    gap: float | None = None
    solve_ms: float | None = None
    stopped_by: StoppedBy | None = None


class PlanProfile(BaseModel):
    """Which profile priced a plan (v1 addition): enough to find its exact constants again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., description="The profile's name (``cluster`` for a cluster's own).")
    version: int | None = Field(None, description="Version of the stored named profile.")
    job_version: int | None = Field(
        None, description="Version of the job's refitted constants (opted-in jobs)."
    )

    @classmethod
    def of(cls, request: PlanRequest) -> PlanProfile | None:
        """The profile block of a request's plan; None when the request carries no profile
        (planned with its cluster's constants, whose values the request itself states)."""
        p = request.profile
        return None if p is None else cls(name=p.name, version=p.version, job_version=p.job_version)


class Plan(BaseModel):
    """The layout of one step (contract v1). More fields may be added, never renamed."""

    model_config = ConfigDict(extra="allow")

    version: Literal["v1"] = "v1"
    plan_id: str
    mode: Mode
    status: Status
    job_id: str | None = None
    step: int | None = None
    parents: list[ParentOut]
    children: list[ChildOut]
    tokens: list[int]
    cu_seqlens: list[list[int]]
    all_to_all: AllToAll
    metrics: Metrics
    profile: PlanProfile | None = Field(
        None,
        description="The profile the plan was priced with (absent: the cluster's constants).",
    )

    @model_serializer(mode="wrap")
    def _omit_absent_profile(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A plan without a profile serialises exactly as before the field existed."""
        data: dict[str, Any] = handler(self)
        if data.get("profile", 0) is None:
            del data["profile"]
        return data
