"""One distributed training step of the toy model against its single-process reference.

Shared by the 16-rank equivalence test (domain = world) and the mesh test (two data-parallel
replicas, each a domain of 8 ranks running its own plans): every collective here runs over the
repack domain only, and the reference runs on the domain's first rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime_client.agreement import agree_on_plan
from runtime_client.all_to_all import RepackComm
from runtime_client.groups import RepackGroups
from runtime_client.local_layout import LocalLayout, plan_lengths
from runtime_client.toy_model import (
    RepackAttention,
    ToyConfig,
    ToyModel,
    reference_forward,
    synthetic_batch,
)
from solver.schema import Plan


def _grad(param: torch.nn.Parameter) -> torch.Tensor:
    assert param.grad is not None
    return param.grad


def step_errors(
    cfg: ToyConfig,
    model: ToyModel,
    ref: ToyModel | None,
    groups: RepackGroups,
    p: Plan,
    seed: int,
) -> torch.Tensor:
    """Run one step over ``groups``' domain; its first rank compares with the reference.

    Returns [max logit error, loss error, max gradient error, smallest max |gradient|] on every
    rank of the domain.
    """
    domain = groups.domain_group
    agree_on_plan(p, group=domain)
    layout = LocalLayout.from_plan(p, groups.domain_rank)
    lengths = plan_lengths(p)
    tokens_T, labels_T = synthetic_batch(lengths, cfg.vocab, seed)
    total = sum(lengths)
    model.zero_grad(set_to_none=False)
    backend = RepackAttention(RepackComm(layout, groups))
    idx = layout.global_index_N
    logits_NV = model(tokens_T[idx], layout.position_ids_N, backend)
    loss = F.cross_entropy(logits_NV, labels_T[idx], reduction="sum") / total
    loss.backward()
    # Gradient sync inside the domain: every rank holds a replica and a share of the tokens.
    for param in model.parameters():
        dist.all_reduce(_grad(param), group=domain)
    loss_sum = loss.detach().clone()
    dist.all_reduce(loss_sum, group=domain)
    logits_TV = torch.zeros(total, cfg.vocab)
    logits_TV[idx] = logits_NV.detach()
    dist.all_reduce(logits_TV, group=domain)  # each token is owned by exactly one rank
    errors = torch.zeros(4)
    if ref is not None:
        ref.zero_grad(set_to_none=False)
        ref_logits = reference_forward(ref, tokens_T, layout.global_cu_seqlens)
        ref_loss = F.cross_entropy(ref_logits, labels_T, reduction="sum") / total
        ref_loss.backward()
        grad_err = max(
            float((_grad(a) - _grad(b)).abs().max())
            for a, b in zip(model.parameters(), ref.parameters(), strict=True)
        )
        smallest_grad = min(float(_grad(b).abs().max()) for b in ref.parameters())
        errors = torch.tensor(
            [
                float((logits_TV - ref_logits.detach()).abs().max()),
                float((loss_sum - ref_loss.detach()).abs()),
                grad_err,
                smallest_grad,
            ]
        )
    dist.broadcast(errors, group_src=0, group=domain)
    return errors
