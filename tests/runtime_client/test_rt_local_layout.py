"""LocalLayout: every rank's view of a plan, checked against the packing rule (one process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rt_plans import ChildSpec, hand_plan

from runtime_client.local_layout import LocalLayout, PlanLayoutError, plan_lengths
from solver.planner import plan
from solver.schema import Plan, PlanRequest

DATA = Path(__file__).parent / "data"

LENGTHS = [30, 5, 9, 40, 3, 20, 11]
LAYOUT: list[list[ChildSpec]] = [
    [(4, [0]), (2, [1, 2]), (1, []), (1, [3])],  # parent of 8: children 4, 2, empty 1, 1
    [(4, [4, 5])],  # unrepacked parent of 4
    [(2, [6])],
    [(1, [])],  # empty parents of one rank
    [(1, [])],
]


def _all_layouts(p: Plan) -> list[LocalLayout]:
    return [LocalLayout.from_plan(p, r) for r in range(len(p.tokens))]


def _example_plan() -> Plan:
    return Plan.model_validate(json.loads((DATA / "plan-2node.json").read_text()))


@pytest.mark.parametrize("which", ["hand", "example", "planner"])
def test_local_shards_tile_the_global_batch(which: str) -> None:
    if which == "hand":
        p = hand_plan(LENGTHS, LAYOUT)
    elif which == "example":
        p = _example_plan()
    else:
        request = PlanRequest.model_validate(
            {
                "cluster": {"nodes": 2, "gpus_per_node": 8, "max_tokens_per_rank": 64},
                "model": {"heads": 16, "kv_heads": 4, "head_dim": 8},
                "lengths": [300, 7, 90, 45, 12, 3, 60, 33],
                "parent_sizes": [16],
            }
        )
        p = plan(request)
    layouts = _all_layouts(p)
    lengths = plan_lengths(p)
    total = sum(lengths)
    index = torch.cat([lay.global_index_N for lay in layouts])
    # Every token of the global batch is owned by exactly one rank.
    assert torch.equal(index.sort().values, torch.arange(total))
    cu = layouts[0].global_cu_seqlens
    for lay in layouts:
        assert lay.n_local == p.tokens[lay.rank] == len(lay.global_index_N)
        sid = torch.searchsorted(torch.tensor(cu), lay.global_index_N, right=True) - 1
        assert torch.equal(sid, lay.sample_ids_N)
        assert torch.equal(lay.global_index_N - torch.tensor(cu)[sid], lay.position_ids_N)


def test_lengths_come_back_from_the_contract_example() -> None:
    request = json.loads((DATA / "request-2node.json").read_text())
    assert plan_lengths(_example_plan()) == request["lengths"]


def test_parent_packed_sequence_is_ranks_in_order() -> None:
    p = hand_plan(LENGTHS, LAYOUT)
    layouts = _all_layouts(p)
    cu = layouts[0].global_cu_seqlens
    for parent, parent_cu in zip(p.parents, p.cu_seqlens, strict=True):
        members = layouts[parent.ranks[0] : parent.ranks[1]]
        packed = torch.cat([lay.global_index_N for lay in members])
        expect = [torch.arange(cu[s], cu[s + 1]) for s in parent.samples]
        assert torch.equal(packed, torch.cat([torch.zeros(0, dtype=torch.int64), *expect]))
        for lay in members:
            assert lay.cu_seqlens_full == tuple(parent_cu)
            start = lay.parent_offset
            assert torch.equal(packed[start : start + lay.n_local], lay.global_index_N)


def test_sites_of_a_repacked_parent() -> None:
    p = hand_plan(LENGTHS, LAYOUT)
    lay = LocalLayout.from_plan(p, 4)  # first rank of the 2-rank child holding samples 1, 2
    assert lay.parent_ranks == (0, 8) and lay.child_ranks == (4, 6) and lay.repacked
    assert lay.to_full.output_split_sizes == (7, 8, 7, 8, 7, 7, 0, 40)
    assert lay.to_full.input_split_sizes == (7,) * 8
    assert lay.to_child.input_split_sizes == lay.to_full.output_split_sizes
    assert lay.child_ulysses.ranks == (4, 6)
    assert lay.child_ulysses.output_split_sizes == (7, 7)
    assert lay.cu_seqlens_sparse == (0, 5, 14)
    assert lay.parent_offset == 30 and lay.child_offset == 0
    assert lay.position_ids_N.tolist() == [0, 1, 2, 3, 4, 0, 1]
    empty = LocalLayout.from_plan(p, 6)
    assert empty.n_local == 0 and empty.cu_seqlens_sparse == (0,)
    unrepacked = LocalLayout.from_plan(p, 9)
    assert not unrepacked.repacked and unrepacked.child_ulysses == unrepacked.to_full


def _corrupt(p: Plan, edit: str) -> Plan:
    data = p.model_dump(mode="json")
    if edit == "tokens":
        data["tokens"][0] += 1
        data["tokens"][1] -= 1
    elif edit == "splits":
        data["all_to_all"]["to_full"]["output_split_sizes"][2][0] += 1
    elif edit == "order":
        data["parents"][0]["samples"] = data["parents"][0]["samples"][::-1]
    elif edit == "gap":
        data["children"][1]["ranks"] = [5, 6]
    return Plan.model_validate(data)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("tokens", "packing rule"),
        ("splits", "split sizes"),
        ("order", "rank order"),
        ("gap", "gap or overlap"),
    ],
)
def test_inconsistent_plans_are_rejected(edit: str, message: str) -> None:
    bad = _corrupt(hand_plan(LENGTHS, LAYOUT), edit)
    with pytest.raises(PlanLayoutError, match=message):
        LocalLayout.from_plan(bad, 2)


def test_rank_outside_plan() -> None:
    with pytest.raises(PlanLayoutError, match="outside"):
        LocalLayout.from_plan(hand_plan(LENGTHS, LAYOUT), 16)
