"""The data types of the training-loop integration: what a rank's loader yields
(``LocalSamples``), how plans are asked for (``RepackLoaderConfig``), and what the loop gets
(``RepackBatch``). Kept apart from ``data_iterator`` so a loader can build ``LocalSamples``
without the iterator's threading and collectives."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch

from runtime_client.all_to_all import RepackComm
from runtime_client.local_layout import LocalLayout
from runtime_client.packed_seq import PackedSeqParams
from runtime_client.reroute import upstream_parent_of
from solver.schema import ClusterSpec, Mode, ModelSpec, Plan, PlanRequest


@dataclass(kw_only=True, frozen=True)
class LocalSamples:
    """What the user's iterable yields on each rank: its own samples, packed."""

    tokens_T: torch.Tensor
    """Token ids of the samples, concatenated (int64 ``[T]``, host)."""

    lengths: tuple[int, ...]
    """Tokens per sample, in order; ``sum(lengths) == T``."""

    labels_T: torch.Tensor | None = None
    """Per-token labels moved with the tokens (e.g. next-token targets), same shape."""

    def __post_init__(self) -> None:
        if self.tokens_T.dim() != 1 or self.tokens_T.shape[0] != sum(self.lengths):
            got = tuple(self.tokens_T.shape)
            raise ValueError(f"Expected tokens_T of shape [{sum(self.lengths)}], got {got}.")
        if self.labels_T is not None and self.labels_T.shape != self.tokens_T.shape:
            raise ValueError(f"Expected labels_T of shape {tuple(self.tokens_T.shape)}.")
        if any(n < 1 for n in self.lengths):
            raise ValueError(f"Expected every sample length >= 1, got {self.lengths}.")


@dataclass(kw_only=True, frozen=True)
class RepackLoaderConfig:
    """How to ask for plans and how far ahead."""

    job_id: str
    """Idempotency key prefix: the plan of step s is ``(job_id, s)``; keep it across restarts."""

    cluster: ClusterSpec
    """The repack domain as the planner sees it (``world_size`` = the domain's ranks)."""

    model: ModelSpec
    """The model's attention shape and layer pattern."""

    parent_sizes: tuple[int, ...] | None = None
    """Upstream parents over the domain's ranks (rank order); None = one parent of the domain."""

    mode: Mode = "repack+parent"
    """Planner mode; ``repack`` keeps the upstream membership, ``repack+parent`` may move it."""

    deadline_ms: int | None = None
    """Planner budget per step; None = the service's default."""

    prefetch_depth: int = 2
    """Steps ahead whose plan is requested while the current one trains (0 = on demand)."""

    background: bool = True
    """Prepare the next step (lengths, plan, agreement, token all-to-all) on a helper thread."""

    strategy: Literal["broadcast", "verify"] = "broadcast"
    """``fetch_agreed_plan`` strategy: one request per step (broadcast) or one per rank."""

    src: int = 0
    """Domain rank that asks the service under ``broadcast``."""

    def __post_init__(self) -> None:
        if self.prefetch_depth < 0:
            raise ValueError(f"Expected prefetch_depth >= 0, got {self.prefetch_depth}.")
        sizes = self.upstream_sizes
        if sum(sizes) != self.cluster.world_size:
            raise ValueError(
                f"Expected parent_sizes summing to {self.cluster.world_size}, got {sizes}."
            )

    @property
    def upstream_sizes(self) -> tuple[int, ...]:
        """``parent_sizes``, or one parent of the whole domain when None."""
        if self.parent_sizes is None:
            return (self.cluster.world_size,)
        return self.parent_sizes

    def request(self, step: int, per_rank: list[list[int]]) -> PlanRequest:
        """The step's request: every rank's lengths (rank order) and their upstream parents."""
        sizes = list(self.upstream_sizes)
        return PlanRequest(
            job_id=self.job_id,
            step=step,
            cluster=self.cluster,
            model=self.model,
            lengths=[n for lengths in per_rank for n in lengths],
            parent_sizes=sizes,
            parent_of=upstream_parent_of(per_rank, sizes),
            mode=self.mode,
            deadline_ms=self.deadline_ms,
        )


@dataclass(frozen=True)
class RepackBatch:
    """One step for this rank, in its planned layout (tensors on the target device)."""

    step: int
    tokens_N: torch.Tensor
    """This rank's token ids in its child layout (``layout.n_local`` of them)."""

    labels_N: torch.Tensor | None
    """Their labels, if the iterable gave labels."""

    position_ids_N: torch.Tensor
    """Position of each token inside its sample (rotary embeddings)."""

    full: PackedSeqParams
    """Parent packed sequence after ``comm.to_full`` (full-attention layers)."""

    sparse: PackedSeqParams
    """Child packed sequence after ``comm.child_to_heads`` (sparse layers)."""

    comm: RepackComm
    """The step's exchanges for the attention layers."""

    plan: Plan
    source: str
    """Where the plan came from on this rank: service, fallback, or broadcast (from ``src``)."""

    fetch_seconds: float
    """Time from asking for the plan to having it, on this rank (mostly hidden by prefetch)."""

    total_tokens: int
    """Tokens in the step over the whole domain (normalise a summed loss by this)."""

    @property
    def layout(self) -> LocalLayout:
        return self.comm.layout

    def to(self, device: torch.device) -> RepackBatch:
        """The batch with its tensors on ``device`` (non-blocking copies; self if already)."""
        if self.tokens_N.device == device:
            return self
        labels_N = self.labels_N
        return dataclasses.replace(
            self,
            tokens_N=self.tokens_N.to(device, non_blocking=True),
            labels_N=None if labels_N is None else labels_N.to(device, non_blocking=True),
            position_ids_N=self.position_ids_N.to(device, non_blocking=True),
            full=self.full.to(device),
            sparse=self.sparse.to(device),
        )
