"""What one rank needs from a Plan: its tokens, groups, split sizes, cu_seqlens and indices.

Everything here is recomputed from the plan's parents and children with the packing rule
(docs/design.md section 3, rule 3) and checked against the plan's own ``tokens``, ``cu_seqlens`` and
``all_to_all`` fields: a plan whose fields disagree with its layout fails here, on every rank,
before any collective could deadlock on mismatched split sizes: every rank checks the whole
plan (all ranks' split-size rows), not only its own row, so all ranks refuse a bad plan
together (the plan itself is the same everywhere: see ``agreement.agree_on_plan``).

Conventions:

* the *global packed batch* is every sample in id order, concatenated (``global_cu_seqlens``);
  the data loader builds it, and ``global_index_N`` cuts out this rank's tokens;
* the *child packed sequence* is the child's samples in packing order; rank i of a child of
  size k owns ``[floor(i*T_c/k), floor((i+1)*T_c/k))`` of it;
* the *parent packed sequence* is its ranks' tokens in rank order (= its children's samples in
  rank order), with ``cu_seqlens_full``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from solver.schema import ChildOut, Plan


class PlanLayoutError(ValueError):
    """The plan's fields contradict its layout, or do not cover this rank."""


def split_tokens(total: int, size: int) -> list[int]:
    """Tokens of each rank of a group: rank i owns ``[floor(i*T/k), floor((i+1)*T/k))``."""
    return [(i + 1) * total // size - i * total // size for i in range(size)]


def plan_lengths(plan: Plan) -> list[int]:
    """Sample lengths by id, read from the parents' ``cu_seqlens`` (the plan carries no list)."""
    found: dict[int, int] = {}
    for parent, cu in zip(plan.parents, plan.cu_seqlens, strict=True):
        if len(cu) != len(parent.samples) + 1:
            raise PlanLayoutError(
                f"parent {parent.id}: cu_seqlens has {len(cu)} entries for "
                f"{len(parent.samples)} samples"
            )
        for m, s in enumerate(parent.samples):
            if s in found:
                raise PlanLayoutError(f"sample {s} appears in two parents")
            found[s] = cu[m + 1] - cu[m]
    if sorted(found) != list(range(len(found))):
        raise PlanLayoutError("sample ids are not 0..n-1")
    return [found[s] for s in range(len(found))]


def cumulative(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@dataclass(kw_only=True, frozen=True)
class GroupSite:
    """One variable all-to-all as this rank sees it: the group and its split sizes (tokens)."""

    ranks: tuple[int, int]
    """The group's ranks ``[start, end)``."""

    index: int
    """This rank's position in the group."""

    input_split_sizes: tuple[int, ...]
    """Tokens this rank sends to each group rank, in rank order."""

    output_split_sizes: tuple[int, ...]
    """Tokens this rank receives from each group rank, in rank order."""

    @property
    def size(self) -> int:
        return self.ranks[1] - self.ranks[0]

    def transposed(self) -> GroupSite:
        """The inverse exchange (e.g. ``to_child`` from ``to_full``): splits swapped."""
        return GroupSite(
            ranks=self.ranks,
            index=self.index,
            input_split_sizes=self.output_split_sizes,
            output_split_sizes=self.input_split_sizes,
        )


def sequence_to_heads_site(ranks: tuple[int, int], owned: list[int], index: int) -> GroupSite:
    """Ulysses split sizes: rank i sends its n_i tokens to every rank, receives every n_j."""
    return GroupSite(
        ranks=ranks,
        index=index,
        input_split_sizes=tuple([owned[index]] * len(owned)),
        output_split_sizes=tuple(owned),
    )


@dataclass(kw_only=True, frozen=True)
class LocalLayout:
    """This rank's view of one step's plan."""

    rank: int
    """Global rank."""

    parent_id: int
    child_id: int
    parent_ranks: tuple[int, int]
    """Full-attention group ``[start, end)``."""

    child_ranks: tuple[int, int]
    """Sparse-layer group ``[start, end)``; equal to ``parent_ranks`` when unrepacked."""

    n_local: int
    """Tokens this rank owns in the child layout (``plan.tokens[rank]``)."""

    to_full: GroupSite
    """Fused exchange before full attention (plan's ``all_to_all.to_full``), parent group."""

    to_child: GroupSite
    """Fused exchange after full attention (plan's ``all_to_all.to_child``), parent group."""

    child_ulysses: GroupSite
    """Sequence-to-heads Ulysses exchange of sparse layers over the child group."""

    cu_seqlens_full: tuple[int, ...]
    """Sample boundaries in the parent packed sequence (full attention after ``to_full``)."""

    cu_seqlens_sparse: tuple[int, ...]
    """Sample boundaries in the child packed sequence (sparse attention after Ulysses)."""

    parent_offset: int
    """Position of this rank's first token in the parent packed sequence."""

    child_offset: int
    """Position of this rank's first token in the child packed sequence."""

    global_cu_seqlens: tuple[int, ...]
    """Sample boundaries of the global packed batch (samples in id order)."""

    global_index_N: torch.Tensor
    """Positions of this rank's tokens in the global packed batch (int64, length n_local)."""

    position_ids_N: torch.Tensor
    """Position of each local token inside its sample (for rotary embeddings)."""

    sample_ids_N: torch.Tensor
    """Sample id of each local token."""

    @property
    def repacked(self) -> bool:
        """False when the parent is one child of its own size (the baseline layout)."""
        return self.child_ranks != self.parent_ranks

    @property
    def total_tokens(self) -> int:
        return self.global_cu_seqlens[-1]

    @classmethod
    def from_plan(cls, plan: Plan, rank: int) -> LocalLayout:
        """Check the plan's layout fields and cut out this rank's view."""
        world = len(plan.tokens)
        if not 0 <= rank < world:
            raise PlanLayoutError(f"rank {rank} is outside the plan's {world} ranks")
        lengths = plan_lengths(plan)
        children = sorted(plan.children, key=lambda c: c.ranks[0])
        _check_tiling(plan, children, lengths, world)
        parent = next(p for p in plan.parents if p.ranks[0] <= rank < p.ranks[1])
        child = next(c for c in children if c.ranks[0] <= rank < c.ranks[1])
        p_start, p_end = parent.ranks
        owned = plan.tokens[p_start:p_end]
        to_full = sequence_to_heads_site((p_start, p_end), owned, rank - p_start)
        # Every rank's rows, not only this one: a row that is wrong for rank r must stop all
        # ranks here, or r's peers enter the all-to-all and wait for the group timeout.
        _check_all_splits(plan)
        c_start, c_end = child.ranks
        child_cu = cumulative([lengths[s] for s in child.samples])
        child_owned = split_tokens(child_cu[-1], c_end - c_start)
        child_offset = sum(child_owned[: rank - c_start])
        global_cu = cumulative(lengths)
        n_local = plan.tokens[rank]
        g_index, pos, sid = _local_indices(child.samples, lengths, global_cu, child_offset, n_local)
        return cls(
            rank=rank,
            parent_id=parent.id,
            child_id=child.id,
            parent_ranks=(p_start, p_end),
            child_ranks=(c_start, c_end),
            n_local=n_local,
            to_full=to_full,
            to_child=to_full.transposed(),
            child_ulysses=sequence_to_heads_site((c_start, c_end), child_owned, rank - c_start),
            cu_seqlens_full=tuple(plan.cu_seqlens[plan.parents.index(parent)]),
            cu_seqlens_sparse=tuple(child_cu),
            parent_offset=sum(owned[: rank - p_start]),
            child_offset=child_offset,
            global_cu_seqlens=tuple(global_cu),
            global_index_N=g_index,
            position_ids_N=pos,
            sample_ids_N=sid,
        )


def _check_tiling(plan: Plan, children: list[ChildOut], lengths: list[int], world: int) -> None:
    """Parents tile the world, children tile their parent, tokens follow the packing rule."""
    at = 0
    for parent in plan.parents:
        if parent.ranks[0] != at:
            raise PlanLayoutError(f"parent {parent.id} starts at {parent.ranks[0]}, not {at}")
        at = parent.ranks[1]
        mine = [c for c in children if c.parent == parent.id]
        if not mine or mine[0].ranks[0] != parent.ranks[0] or mine[-1].ranks[1] != at:
            raise PlanLayoutError(f"children of parent {parent.id} do not tile its ranks")
        if any(a.ranks[1] != b.ranks[0] for a, b in itertools.pairwise(mine)):
            raise PlanLayoutError(f"children of parent {parent.id} leave a gap or overlap")
        packed = [s for c in mine for s in c.samples]
        if packed != parent.samples:
            raise PlanLayoutError(
                f"parent {parent.id}: samples {parent.samples} are not its children's samples "
                f"in rank order {packed}"
            )
        for c in mine:
            expect = split_tokens(sum(lengths[s] for s in c.samples), c.ranks[1] - c.ranks[0])
            if plan.tokens[c.ranks[0] : c.ranks[1]] != expect:
                raise PlanLayoutError(
                    f"child {c.id}: tokens {plan.tokens[c.ranks[0] : c.ranks[1]]} "
                    f"do not follow the packing rule {expect}"
                )
    if at != world:
        raise PlanLayoutError(f"parents cover {at} ranks, the plan has {world}")


def _check_all_splits(plan: Plan) -> None:
    """Every rank's split-size rows follow its parent's layout (the same check on every rank).

    Rank r of a parent sends ``[n_r] * P`` and receives the parent's ``tokens``; ``to_child``
    is the transpose. List comparisons only: O(ranks x parent size) integer compares per step.
    """
    full, back = plan.all_to_all.to_full, plan.all_to_all.to_child
    tables = (
        full.input_split_sizes,
        full.output_split_sizes,
        back.input_split_sizes,
        back.output_split_sizes,
    )
    if any(len(t) != len(plan.tokens) for t in tables):
        raise PlanLayoutError(f"split-size tables need one row per rank ({len(plan.tokens)})")
    for parent in plan.parents:
        start, end = parent.ranks
        owned = plan.tokens[start:end]
        for rank in range(start, end):
            sends = [plan.tokens[rank]] * (end - start)
            if (
                full.input_split_sizes[rank] != sends
                or full.output_split_sizes[rank] != owned
                or back.input_split_sizes[rank] != owned
                or back.output_split_sizes[rank] != sends
            ):
                got = tuple(tuple(t[rank]) for t in tables)
                want = (tuple(sends), tuple(owned), tuple(owned), tuple(sends))
                raise PlanLayoutError(
                    f"rank {rank}: plan split sizes {got} differ from layout {want}"
                )


def _local_indices(
    samples: list[int], lengths: list[int], global_cu: list[int], offset: int, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Global positions, in-sample positions and sample ids of child tokens [offset, offset+n)."""
    g_index, pos, sid = [], [], []
    at = 0  # start of the current sample in the child packed sequence
    for s in samples:
        lo, hi = max(offset, at), min(offset + n, at + lengths[s])
        if lo < hi:
            g_index.append(torch.arange(lo - at, hi - at) + global_cu[s])
            pos.append(torch.arange(lo - at, hi - at))
            sid.append(torch.full((hi - lo,), s))
        at += lengths[s]
    if not g_index:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty.clone(), empty.clone()
    return torch.cat(g_index), torch.cat(pos), torch.cat(sid)
