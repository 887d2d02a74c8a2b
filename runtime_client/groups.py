"""Process groups for every parent and child a plan can name, created once per job.

``dist.new_group`` is a collective over the *whole* world: every rank must call it, for every
group, in the same order, even ranks that are not members. Plans change every step, so groups
cannot be created on demand. The layout rules (docs/design.md section 3) make the set finite:

* a child (or a parent of at most one node) of size ``k`` is an aligned block ``[s, s + k)``
  with ``s % k == 0``;
* a parent wider than a node (``P > G``) starts on a node boundary (``s % G == 0``), not
  necessarily on a multiple of ``P`` (parents ``[8, 16, 8]`` on 32 ranks are valid).

``candidate_blocks`` enumerates that set deterministically (by size, then start) and
``RepackGroups.setup`` creates it once. Blocks of one rank need no communicator (their
all-to-all is a local copy) and the block spanning the world reuses the default group, so
neither costs a ``new_group`` call. Counts for 8 GPUs per node (see ``docs/runtime.md``):
64 ranks -> 68 communicators (133 blocks), 1,024 ranks -> 1,544 communicators (2,569 blocks).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from solver.schema import CHILD_SIZES, is_power_of_two

logger = logging.getLogger(__name__)

Block = tuple[int, int]
"""A contiguous rank range ``(start, end)``, half-open, as in the plan's ``ranks`` fields."""


@dataclass(kw_only=True, frozen=True)
class GroupConfig:
    """Which blocks to create and how long collectives may wait."""

    world_size: int
    """Number of ranks in the job (``nodes * gpus_per_node``)."""

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
    """Backend of the subgroups; None = the default group's backend."""

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
    """The blocks that need a ``new_group`` call: not single ranks, not the whole world."""
    return [b for b in candidate_blocks(config) if 1 < b[1] - b[0] < config.world_size]


def init_distributed(*, backend: str = "gloo", timeout_s: float = 600.0) -> None:
    """Initialise the default process group from the launcher's environment, once.

    Idempotent: a second call (or a group a launcher already set up) is left as it is.
    """
    if dist.is_initialized():
        return
    dist.init_process_group(
        backend=backend,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_s),
    )


@dataclass
class RepackGroups:
    """All parent and child communicators of a job, created once and looked up by block."""

    config: GroupConfig
    """What to create; see ``GroupConfig``."""

    setup_seconds: float = 0.0
    """Wall time ``setup`` took on this rank (creating every communicator)."""

    _groups: dict[Block, dist.ProcessGroup] = field(default_factory=dict, repr=False)
    _ready: bool = field(default=False, repr=False)

    def setup(self) -> RepackGroups:
        """Create every communicator in ``communicator_blocks`` order; idempotent.

        Collective over the default group: all ranks must call it (the same number of times
        is not required: the second and later calls return at once without communicating).
        """
        if self._ready:
            return self
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call init_distributed().")
        world = dist.get_world_size()
        if world != self.config.world_size:
            raise ValueError(
                f"Expected a world of {self.config.world_size} ranks, the job has {world}."
            )
        t0 = time.perf_counter()
        timeout = timedelta(seconds=self.config.timeout_s)
        for block in communicator_blocks(self.config):
            # Every rank calls new_group for every block, members or not, in the same order:
            # that is what keeps the communicators' internal ids consistent across ranks.
            group = dist.new_group(
                ranks=list(range(*block)), timeout=timeout, backend=self.config.backend
            )
            if dist.get_rank() in range(*block):
                self._groups[block] = group
        self.setup_seconds = time.perf_counter() - t0
        self._ready = True
        logger.info(
            "created %d communicators (%d blocks, %d with this rank) in %.3f s",
            len(communicator_blocks(self.config)),
            len(candidate_blocks(self.config)),
            len(self._groups),
            self.setup_seconds,
        )
        return self

    def group(self, block: Block | list[int]) -> dist.ProcessGroup | None:
        """The communicator of ``block`` for this rank; None for a single-rank block.

        Raises ``KeyError`` when the rank is not a member or the block was not created (a plan
        outside the configured sizes), rather than silently using a wrong group.
        """
        start, end = block
        if not self._ready:
            raise RuntimeError("RepackGroups.setup() has not run on this rank.")
        if end - start == 1:
            return None
        if end - start == self.config.world_size:
            return dist.group.WORLD
        try:
            return self._groups[(start, end)]
        except KeyError:
            raise KeyError(
                f"no communicator for ranks [{start}, {end}) on rank {dist.get_rank()}; "
                "either the rank is not a member or the block is not in the configured sizes"
            ) from None

    @property
    def member_blocks(self) -> list[Block]:
        """Blocks with a communicator that include this rank."""
        return sorted(self._groups, key=lambda b: (b[1] - b[0], b[0]))
