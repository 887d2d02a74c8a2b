"""Process groups for every parent and child a plan can name, created once per job.

The *repack domain* is the process group the plans cover: the world, or one dimension of a
``DeviceMesh`` (e.g. the context-parallel dimension inside data-parallel replicas); plan rank
``i`` is domain rank ``i``. Each replica runs its own plans on its own communicators.

Plans change every step, so communicators cannot be created on demand (creation is collective
and, with NCCL, slow). The layout rules (docs/design.md section 3) make the set finite:

* a child (or a parent of at most one node) of size ``k`` is an aligned block ``[s, s + k)``
  with ``s % k == 0``;
* a parent wider than a node (``P > G``) starts on a node boundary (``s % G == 0``), not
  necessarily on a multiple of ``P`` (parents ``[8, 16, 8]`` on 32 ranks are valid).

``candidate_blocks`` enumerates that set deterministically (by size, then start) and
``RepackGroups.setup`` creates it once, for the sizes the deployment allows (``GroupConfig``),
then warms every communicator with one tiny collective so that no training step pays for
creation. Blocks of one rank need no communicator (their all-to-all is a local copy) and the
block spanning the domain reuses the domain's group. Creation (``GroupConfig.creation``):

* ``split``: ``dist.split_group`` of the domain's communicator (NCCL with a bound device:
  the children share the parent's resources, ``ncclCommSplit``); one call per partition of
  blocks, every domain rank takes part;
* ``world``: ``dist.new_group``, which every world rank calls for every block of every replica,
  in the same order (gloo, and any backend that cannot split);
* ``auto`` (default): ``split`` where the backend supports it, else ``world``.

Not ``new_group(use_local_synchronization=True)``: torch names such a group by its ranks *and*
the number of groups the calling process has made so far, so two members that are in different
numbers of earlier groups (a rank in two overlapping wide parents) wait under different names
forever; measured: 32 gloo ranks hang on the parent ``[8, 24)``.

Counts for 8 GPUs per node (see ``docs/runtime.md``): 64 ranks -> 68 communicators (133
blocks), 1,024 ranks -> 1,544 communicators (2,569 blocks), at most 9 / 129 per rank.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

from solver.schema import CHILD_SIZES, is_power_of_two

logger = logging.getLogger(__name__)

Creation = Literal["auto", "split", "world"]

Block = tuple[int, int]
"""A contiguous rank range ``(start, end)``, half-open, as in the plan's ``ranks`` fields."""


@dataclass(kw_only=True, frozen=True)
class GroupConfig:
    """Which blocks to create and how long collectives may wait."""

    world_size: int
    """Ranks in the repack domain (``nodes * gpus_per_node`` of one replica); the job's world
    when the domain is the world."""

    gpus_per_node: int
    """Ranks per node ``G``; children never cross a node, wide parents start on node boundaries."""

    child_sizes: tuple[int, ...] = CHILD_SIZES
    """Child sizes the planner may use (docs/design.md rule 2: 1, 2, 4, 8, capped at ``G``)."""

    parent_sizes: tuple[int, ...] | None = None
    """Parent sizes the planner may use; None = every power of two up to ``world_size``.
    Restricting this (e.g. to the sizes that divide the model's heads) is the main lever on the
    number of communicators at scale."""

    timeout_s: float = 600.0
    """Timeout of every collective on these groups; a hung peer fails loudly after this."""

    backend: str | None = None
    """Backend of the subgroups; None = the default group's backend (ignored by ``split``)."""

    creation: Creation = "auto"
    """How communicators are made: ``split``, ``world`` or ``auto`` (module doc)."""

    warm_up: bool = True
    """Run one 1-element all-reduce on every new communicator at setup (NCCL creates its
    communicators lazily, on first use: without this the first training step pays for them)."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"Expected world_size >= 1, got {self.world_size}.")
        if not is_power_of_two(self.gpus_per_node):
            raise ValueError(f"Expected gpus_per_node a power of two, got {self.gpus_per_node}.")
        if self.world_size % self.gpus_per_node != 0 and self.world_size > self.gpus_per_node:
            raise ValueError(
                f"Expected world_size a multiple of gpus_per_node ({self.gpus_per_node}), "
                f"got {self.world_size}."
            )
        for size in (*self.child_sizes, *(self.parent_sizes or ())):
            if not is_power_of_two(size):
                raise ValueError(f"Expected power-of-two group sizes, got {size}.")
        if self.timeout_s <= 0:
            raise ValueError(f"Expected timeout_s > 0, got {self.timeout_s}.")
        if self.creation not in ("auto", "split", "world"):
            raise ValueError(f"Expected creation in auto, split, world, got {self.creation!r}.")


def candidate_blocks(config: GroupConfig) -> list[Block]:
    """Every rank block a valid plan can name, sorted by (size, start): the creation order."""
    w, g = config.world_size, config.gpus_per_node
    blocks: set[Block] = set()
    for k in config.child_sizes:
        if k <= min(g, w):
            blocks.update((s, s + k) for s in range(0, w - k + 1, k))
    sizes = config.parent_sizes
    if sizes is None:
        sizes = tuple(1 << i for i in range(w.bit_length()) if (1 << i) <= w)
    for p in sizes:
        if p > w:
            continue
        step = min(p, g) if p <= g else g  # rule 1: start % min(P, G) == 0, node-aligned if P > G
        blocks.update((s, s + p) for s in range(0, w - p + 1, step))
    return sorted(blocks, key=lambda b: (b[1] - b[0], b[0]))


def communicator_blocks(config: GroupConfig) -> list[Block]:
    """The blocks that need a communicator: not single ranks, not the whole domain."""
    return [b for b in candidate_blocks(config) if 1 < b[1] - b[0] < config.world_size]


def communicators_per_rank(config: GroupConfig) -> list[int]:
    """How many communicators each domain rank is a member of (the domain's own not counted).

    What a rank pays for: with NCCL every communicator holds its own buffers unless it was
    split from its parent with shared resources (``docs/runtime.md`` has the estimate).
    """
    counts = [0] * config.world_size
    for start, end in communicator_blocks(config):
        for rank in range(start, end):
            counts[rank] += 1
    return counts


def split_partitions(config: GroupConfig) -> list[list[Block]]:
    """``communicator_blocks`` as disjoint sets, one ``split_group`` call each, in a fixed order.

    Blocks of one size up to a node tile the domain (one split); node-aligned parents of
    ``P > G`` overlap, so those of size P go in ``P / G`` splits by start node modulo ``P / G``.
    """
    by_key: dict[tuple[int, int], list[Block]] = {}
    for start, end in communicator_blocks(config):
        size = end - start
        phase = (start // config.gpus_per_node) % (size // config.gpus_per_node or 1)
        by_key.setdefault((size, phase), []).append((start, end))
    return [by_key[key] for key in sorted(by_key)]


_bound_device: torch.device | None = None


def bound_device() -> torch.device:
    """The device collectives of this process use: the one ``init_distributed`` bound, else
    ``cuda:LOCAL_RANK`` when CUDA is there (never a blind ``current_device()``, which is GPU 0
    on every rank of a node until someone calls ``set_device``), else the CPU."""
    if _bound_device is not None:
        return _bound_device
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a collective's tensors must live on ``group``: host for gloo, the bound GPU else."""
    if dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    return bound_device()


def init_distributed(
    *, backend: str | None = None, timeout_s: float = 600.0, bind_device: bool = True
) -> torch.device:
    """Initialise the default process group from the launcher's environment, once; bind a device.

    With CUDA (and ``bind_device``), rank ``LOCAL_RANK`` is bound to ``cuda:LOCAL_RANK``
    (``torch.cuda.set_device`` and ``init_process_group(device_id=...)``, which lets NCCL create
    the world communicator eagerly and split it later). ``backend`` None: NCCL with CUDA, gloo
    without. Idempotent: a second call (or a group a launcher already set up) keeps the group;
    the device is still bound. Returns the bound device.
    """
    global _bound_device
    device = torch.device("cpu")
    if bind_device and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    _bound_device = device
    if dist.is_initialized():
        return device
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(
        backend=backend,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_s),
        # device_id: NCCL creates the world communicator now and may split it later.
        device_id=device if backend == "nccl" and device.type == "cuda" else None,
    )
    return device


def _supports_split(domain: dist.ProcessGroup) -> bool:
    """NCCL (comm split) with a device bound at init; gloo cannot split."""
    world = dist.group.WORLD
    bound = getattr(world, "bound_device_id", None) if world is not None else None
    return dist.get_backend(domain) == "nccl" and bound is not None


@dataclass
class RepackGroups:
    """All parent and child communicators of one repack domain, created once, looked up by block.

    ``domain`` is the process group plans cover (default: the world); blocks are domain ranks.
    """

    config: GroupConfig
    """What to create; see ``GroupConfig``."""

    domain: dist.ProcessGroup | None = None
    """The repack domain; None = the world. ``from_mesh`` takes it from a ``DeviceMesh``."""

    setup_seconds: float = 0.0
    """Wall time ``setup`` took on this rank (creating and warming every communicator)."""

    creation_used: str = ""
    """The creation path ``setup`` took (``split`` or ``world``)."""

    _groups: dict[Block, dist.ProcessGroup] = field(default_factory=dict, repr=False)
    _ranks: list[int] = field(default_factory=list, repr=False)
    _ready: bool = field(default=False, repr=False)

    @classmethod
    def from_mesh(cls, mesh: DeviceMesh, dim: str | int, config: GroupConfig) -> RepackGroups:
        """Groups over one dimension of ``mesh`` (e.g. ``"cp"`` of a ``("dp", "cp")`` mesh)."""
        return cls(config=config, domain=mesh.get_group(dim))

    @property
    def domain_group(self) -> dist.ProcessGroup:
        """The domain's process group (the world group when ``domain`` is None)."""
        group = self.domain if self.domain is not None else dist.group.WORLD
        assert group is not None, "torch.distributed is not initialised"
        return group

    @property
    def domain_rank(self) -> int:
        """This rank's index in the domain: its rank in every plan."""
        return dist.get_rank(self.domain_group)

    def global_ranks(self, block: Block) -> list[int]:
        """World ranks of a block of this rank's domain."""
        return self._ranks[block[0] : block[1]]

    def setup(self) -> RepackGroups:
        """Create (and warm) every communicator of ``communicator_blocks``; idempotent.

        Collective over the domain (``split``) or the world (``world``); every rank of every
        replica calls it once. Later calls return at once
        without communicating.
        """
        if self._ready:
            return self
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call init_distributed().")
        domain = self.domain_group
        size = dist.get_world_size(domain)
        if size != self.config.world_size:
            raise ValueError(f"Expected a domain of {self.config.world_size} ranks, it has {size}.")
        self._ranks = dist.get_process_group_ranks(domain)
        mode = self.config.creation
        if mode == "auto":
            mode = "split" if _supports_split(domain) else "world"
        t0 = time.perf_counter()
        self._create_by_split() if mode == "split" else self._create_world()
        if self.config.warm_up:
            self._warm_up()
        self.setup_seconds = time.perf_counter() - t0
        self.creation_used = mode
        self._ready = True
        logger.info(
            "created %d communicators (%s; %d blocks, %d with this rank) in %.3f s",
            len(communicator_blocks(self.config)),
            mode,
            len(candidate_blocks(self.config)),
            len(self._groups),
            self.setup_seconds,
        )
        return self

    def _timeout(self) -> timedelta:
        return timedelta(seconds=self.config.timeout_s)

    def _create_by_split(self) -> None:
        """One ``split_group`` per partition; the domain's ranks all call each, in one order."""
        me = self.domain_rank
        for blocks in split_partitions(self.config):
            group = dist.split_group(
                parent_pg=self.domain_group,
                split_ranks=[list(range(*b)) for b in blocks],
                timeout=self._timeout(),
                group_desc=f"repack_split_{blocks[0][1] - blocks[0][0]}",
            )
            mine = [b for b in blocks if b[0] <= me < b[1]]
            if group is not None and mine:
                self._groups[mine[0]] = group

    def _create_world(self) -> None:
        """Every world rank creates every block of every replica, in the same order."""
        domains: list[list[int] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(domains, self._ranks)
        replicas = sorted({tuple(d) for d in domains if d is not None})
        for block in communicator_blocks(self.config):
            for ranks in replicas:
                group = dist.new_group(
                    ranks=list(ranks[block[0] : block[1]]),
                    timeout=self._timeout(),
                    backend=self.config.backend,
                )
                if list(ranks) == self._ranks and block[0] <= self.domain_rank < block[1]:
                    self._groups[block] = group

    def _warm_up(self) -> None:
        """One 1-element all-reduce on the domain, then per communicator in creation order."""
        one = torch.ones(1, device=collective_device(self.domain_group))
        dist.all_reduce(one, group=self.domain_group)
        for block in sorted(self._groups, key=lambda b: (b[1] - b[0], b[0])):
            group = self._groups[block]
            one = torch.ones(1, device=collective_device(group))
            dist.all_reduce(one, group=group)

    def group(self, block: Block | list[int]) -> dist.ProcessGroup | None:
        """The communicator of ``block`` (domain ranks) for this rank; None for a single rank.

        Raises ``KeyError`` when the rank is not a member or the block was not created (a plan
        outside the configured sizes), rather than silently using a wrong group.
        """
        start, end = block
        if not self._ready:
            raise RuntimeError("RepackGroups.setup() has not run on this rank.")
        if end - start == 1:
            return None
        if end - start == self.config.world_size:
            return self.domain_group
        try:
            return self._groups[(start, end)]
        except KeyError:
            raise KeyError(
                f"no communicator for domain ranks [{start}, {end}) on domain rank "
                f"{self.domain_rank}; either the rank is not a member or the block is not in "
                "the configured sizes"
            ) from None

    @property
    def member_blocks(self) -> list[Block]:
        """Blocks with a communicator that include this rank."""
        return sorted(self._groups, key=lambda b: (b[1] - b[0], b[0]))
