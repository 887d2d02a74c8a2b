"""A stateful synthetic data source for the example, the tests and the benchmark.

It models a real loader of a sequence-parallel job: every *upstream parent* (a block of
``parent_size`` ranks) draws its own long-tailed set of samples for the step, up to the
parent's token budget, and deals them to its ranks (largest first, to the rank with the fewest
tokens), so samples longer than one rank's budget exist, as they do in practice. Each rank
keeps only its own share: that is what ``RepackDataIterator`` pulls. Everything is seeded by
``(seed, step, parent)``: the same on every run and every rank.

``state_dict`` / ``load_state_dict`` make it ``Stateful`` the way torchdata's
``StatefulDataLoader`` is: the state is the next batch, and ``iter()`` resumes there.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from runtime_client.batches import LocalSamples


@dataclass(kw_only=True)
class ToySampleSource:
    """Rank ``rank``'s batches of a job with upstream parents of ``parent_size`` ranks."""

    rank: int
    """This rank's index in the repack domain."""

    parent_size: int
    """Ranks of one upstream parent (the loader packs samples per parent)."""

    tokens_per_parent: int
    """Token budget of one parent per step (the loader fills up to this)."""

    longest: int
    """Longest sample drawn (at most the widest parent's capacity)."""

    vocab: int = 64
    seed: int = 0
    steps: int | None = None
    """Batches before the source ends; None = endless."""

    batch: int = 0
    """The next batch to yield (the checkpointed state)."""

    def state_dict(self) -> dict[str, Any]:
        return {"batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch = int(state["batch"])

    def __iter__(self) -> Iterator[LocalSamples]:
        while self.steps is None or self.batch < self.steps:
            samples = self.samples(self.batch)
            self.batch += 1
            yield samples

    def parent_lengths(self, step: int, parent: int) -> list[int]:
        """The upstream parent's sample lengths at ``step``: a long-tailed mix, packed to the
        parent's budget exactly (the last sample is cut to fit, as packing loaders do)."""
        rng = random.Random(f"{self.seed}/{step}/{parent}")
        lengths: list[int] = []
        room = self.tokens_per_parent
        while room > 0:
            n = rng.choice([rng.randint(1, 12), rng.randint(12, 60), rng.randint(60, 400)])
            lengths.append(min(n, self.longest, room))
            room -= lengths[-1]
        return lengths

    def samples(self, step: int) -> LocalSamples:
        """This rank's share of its parent's samples at ``step`` (ids and next-token labels)."""
        parent, index = divmod(self.rank, self.parent_size)
        lengths = self.parent_lengths(step, parent)
        loads = [0] * self.parent_size
        mine: list[int] = []
        for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
            r = min(range(self.parent_size), key=lambda r: (loads[r], r))
            loads[r] += lengths[i]
            if r == index:
                mine.append(i)
        mine.sort()
        gen = torch.Generator().manual_seed(hash((self.seed, step, parent)) & 0x7FFFFFFF)
        ids_T = torch.randint(0, self.vocab, (sum(lengths) + 1,), generator=gen)
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        tokens = [ids_T[starts[i] : starts[i] + lengths[i]] for i in mine]
        labels = [ids_T[starts[i] + 1 : starts[i] + lengths[i] + 1] for i in mine]
        empty = torch.zeros(0, dtype=torch.int64)
        return LocalSamples(
            tokens_T=torch.cat(tokens) if tokens else empty,
            lengths=tuple(lengths[i] for i in mine),
            labels_T=torch.cat(labels) if labels else empty.clone(),
        )
