"""Every bad input of the contract gets an error that names the field and the reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from solver.cost_model import CostModel
from solver.errors import PlanningError
from solver.measurement_schema import StepMeasurement
from solver.profile_lookup import UnknownProfileError, with_named_profile
from solver.profiles import CLUSTER_DEFAULTS, DEFAULT_PROFILE, MODEL_DEFAULTS, Profile
from solver.schema import MAX_SAMPLES, ClusterSpec, ModelSpec, PlanRequest


def errors_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        PlanRequest.model_validate_json(json.dumps(data))
    return [(".".join(str(x) for x in e["loc"]), e["msg"]) for e in info.value.errors()]


def assert_error(data: dict[str, Any], field: str, fragment: str) -> None:
    errors = errors_of(data)
    assert any(loc.startswith(field) and fragment in msg for loc, msg in errors), errors


def test_minimal_request_gets_every_default() -> None:
    req = PlanRequest.model_validate({"cluster": {"nodes": 8}, "lengths": [100, 200]})
    assert req.cluster.gpus_per_node == 8 and req.cluster.world_size == 64
    assert req.cluster.inter_node_gbps == pytest.approx(160 / 7)
    assert req.model.full_layers == 12 and req.model.sparse_layers == 36
    assert req.resolved_mode == "repack+sizing"
    given = PlanRequest.model_validate({"lengths": [1], "parent_sizes": [32, 32]})
    assert given.resolved_mode == "repack+parent"


def test_named_profiles_fill_fields_and_allow_overrides() -> None:
    req = PlanRequest.model_validate(
        {"cluster": {"profile": "default", "nodes": 2}, "model": "default", "lengths": [5]}
    )
    assert req.cluster.nodes == 2 and req.cluster.peak_tflops == 989.0
    assert req.model.heads == 32
    assert_error({"cluster": "tpu", "lengths": [1]}, "cluster", "unknown cluster profile 'tpu'")


@pytest.mark.parametrize(
    ("lengths", "fragment"),
    [
        ([], "at least 1 item"),
        ([10, 3.5], "valid integer"),
        ([10, "7"], "valid integer"),
        ([10, True], "valid integer"),
        ([10, 0], "lengths[1] = 0 must be >= 1"),
        ([10, -4], "lengths[1] = -4 must be >= 1"),
        ([32 * 32768 + 1], "exceeds the widest parent's capacity"),
    ],
)
def test_bad_lengths(lengths: list[Any], fragment: str) -> None:
    assert_error({"lengths": lengths}, "lengths", fragment)


def test_total_tokens_beyond_the_cluster() -> None:
    data = {"cluster": {"nodes": 1}, "lengths": [32768] * 9}
    assert_error(data, "lengths", "exceed the cluster's capacity")


def test_too_many_samples() -> None:
    assert_error({"lengths": [1] * (MAX_SAMPLES + 1)}, "lengths", "at most 1000000 items")


@pytest.mark.parametrize(
    ("sizes", "fragment"),
    [
        ([48, 16], "parent size 48 is not a power of two"),
        ([32, 16], "sum to 48, must tile the cluster's 64"),
        ([4, 8, 4, 16, 32], "parent of size 8 at rank 4 is not aligned"),
        ([64], "does not divide heads (32)"),
        ([0, 64], "must be >= 1"),
    ],
)
def test_bad_parent_sizes(sizes: list[int], fragment: str) -> None:
    assert_error({"lengths": [10], "parent_sizes": sizes}, "parent_sizes", fragment)


def test_parent_sizes_too_narrow_for_the_longest_sample() -> None:
    data = {"lengths": [40000], "parent_sizes": [1] * 64}
    assert_error(data, "parent_sizes", "shorter than the longest sample (40000)")


def test_kv_heads_must_divide_heads() -> None:
    assert_error(
        {"model": {"heads": 32, "kv_heads": 6}, "lengths": [1]}, "model.kv_heads", "divide"
    )


def test_parent_size_incompatible_with_kv_heads() -> None:
    data = {
        "cluster": {"nodes": 2},
        "model": {"heads": 48, "kv_heads": 6},
        "lengths": [10],
        "parent_sizes": [4, 4, 8],
    }
    assert_error(data, "parent_sizes", "incompatible with kv_heads (6)")


@pytest.mark.parametrize(
    ("parent_of", "fragment"),
    [
        ([0], "has 1 entries, lengths has 2"),
        ([0, 2], "parent_of[1] = 2 is not a parent index (0..1)"),
        ([0, -1], "parent_of[1] = -1 is not a parent index"),
    ],
)
def test_bad_parent_of(parent_of: list[int], fragment: str) -> None:
    data = {"lengths": [10, 20], "parent_sizes": [32, 32], "parent_of": parent_of}
    assert_error(data, "parent_of", fragment)


def test_parent_of_needs_parent_sizes_and_memory() -> None:
    assert_error({"lengths": [10], "parent_of": [0]}, "parent_of", "requires parent_sizes")
    data = {"lengths": [30000, 30000], "parent_sizes": [1] * 64, "parent_of": [0, 0]}
    assert_error(data, "parent_of", "parent 0 is given 60000 tokens, more than its 32768")


@pytest.mark.parametrize(
    ("cluster", "field", "fragment"),
    [
        ({"nodes": 0}, "cluster.nodes", "greater than or equal to 1"),
        ({"gpus_per_node": 6}, "cluster.gpus_per_node", "power of two"),
        ({"inter_node_gbps": 0}, "cluster.inter_node_gbps", "greater than or equal to 0.01"),
        ({"intra_node_gbps": -1.5}, "cluster.intra_node_gbps", "greater than or equal to 0.01"),
        ({"compute_efficiency": 1.5}, "cluster.compute_efficiency", "less than or equal to 1"),
    ],
)
def test_bad_cluster(cluster: dict[str, Any], field: str, fragment: str) -> None:
    assert_error({"cluster": cluster, "lengths": [1]}, field, fragment)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_bandwidth(value: float) -> None:
    with pytest.raises(ValidationError) as info:
        ClusterSpec(inter_node_gbps=value)
    assert info.value.errors()[0]["loc"] == ("inter_node_gbps",)
    assert "finite number" in info.value.errors()[0]["msg"]


def test_unknown_mode_deadline_and_fields() -> None:
    assert_error({"lengths": [1], "mode": "fast"}, "mode", "'baseline'")
    assert_error({"lengths": [1], "deadline_ms": 0}, "deadline_ms", "greater than 0")
    assert_error({"lengths": [1], "deadline_ms": -5}, "deadline_ms", "greater than 0")
    assert_error({"lengths": [1], "colour": "red"}, "colour", "Extra inputs")
    assert_error({"lengths": [1], "model": {"layer": 3}}, "model.layer", "Extra inputs")


def test_step_requires_job_id() -> None:
    assert_error({"lengths": [1], "step": 3}, "step", "requires job_id")


def test_pattern_letters() -> None:
    with pytest.raises(ValidationError, match="only 'F' and 'S'"):
        ModelSpec(pattern="FSX")
    assert ModelSpec(layers=10, pattern="FSSS").full_layers == 3


def test_inline_profile_and_profile_name() -> None:
    profile = {"name": "lab-a", "efficiency_full_attention": 0.4, "collective_latency_us": 20}
    req = PlanRequest.model_validate({"lengths": [5], "profile": profile})
    assert req.cost_profile.efficiency_full_attention == 0.4
    assert req.cost_profile.efficiency_linear == DEFAULT_PROFILE.efficiency_linear
    both = PlanRequest.model_validate({"lengths": [5], "profile": profile, "profile_name": "lab-a"})
    assert both.profile_name == "lab-a"
    data = {"lengths": [5], "profile": profile, "profile_name": "lab-b"}
    assert_error(data, "profile_name", "names profile 'lab-b' but the inline profile is 'lab-a'")
    assert_error({"lengths": [5], "profile": {"colour": 1}}, "profile.colour", "Extra inputs")
    assert_error({"lengths": [5], "profile": {"name": "a b"}}, "profile.name", "pattern")


def test_cost_profile_without_inline_profile_is_the_clusters() -> None:
    req = PlanRequest.model_validate(
        {"cluster": {"compute_efficiency": 0.3, "intra_node_gbps": 100}, "lengths": [5]}
    )
    p = req.cost_profile
    assert (p.efficiency_full_attention, p.efficiency_sparse_attention) == (0.3, 0.3)
    assert (p.efficiency_linear, p.intra_node_gbps, p.collective_latency_us) == (0.3, 100, 0)


def test_schema_defaults_come_from_the_profiles_module() -> None:
    """One source for every default: the schema's field defaults are the profiles' values."""
    assert ClusterSpec().model_dump(exclude={"profile"}) == CLUSTER_DEFAULTS
    assert ModelSpec().model_dump(exclude={"profile"}) == MODEL_DEFAULTS
    assert CLUSTER_DEFAULTS["peak_tflops"] == DEFAULT_PROFILE.peak_tflops
    assert PlanRequest(lengths=[1]).cost_profile.model_dump(exclude={"name"}) == (
        DEFAULT_PROFILE.model_dump(exclude={"name"})
    )


def test_named_profile_hook() -> None:
    stored = Profile(name="lab-a", version=3, inter_node_gbps=40.0)
    req = PlanRequest.model_validate({"lengths": [5], "profile_name": "lab-a"})
    with pytest.raises(PlanningError, match="profile_name: names the stored profile 'lab-a'"):
        CostModel.from_request(req)
    resolved = with_named_profile(req, {"lab-a": stored}.get)
    assert resolved.profile == stored and resolved.profile_name == "lab-a"
    assert CostModel.from_request(resolved).inter_bytes_per_s == 40e9
    with pytest.raises(UnknownProfileError, match="no stored profile is named 'lab-b'"):
        with_named_profile(req.model_copy(update={"profile_name": "lab-b"}), {}.get)
    plain = PlanRequest.model_validate({"lengths": [5]})
    assert with_named_profile(plain, {}.get) is plain


@pytest.mark.parametrize("name", ["a\x00b", "../etc", "-x", "a b", "a/b"])
def test_a_profile_name_follows_the_stored_profiles_rule(name: str) -> None:
    """A NUL in ``profile_name`` reached PostgreSQL, which refused the string and put the
    service into its database-outage mode (a hostile-input hunt, 2026-12-07)."""
    with pytest.raises(ValidationError, match="profile_name"):
        PlanRequest.model_validate({"lengths": [100], "profile_name": name})
    assert PlanRequest.model_validate({"lengths": [100], "profile_name": "h100.v2_a-b"})


@pytest.mark.parametrize(
    ("job_id", "accepted"),
    [(".", False), ("..", False), ("...", True), (".a", True), ("..a", True), ("a.", True)],
)
def test_a_job_id_is_not_a_dot_segment(job_id: str, accepted: bool) -> None:
    """``.`` and ``..`` were accepted, but a browser resolves them away in
    ``/dashboard/jobs/{job_id}`` (percent-encoded too): their pages could not be reached."""
    data = {"job_id": job_id, "lengths": [100]}
    if accepted:
        assert PlanRequest.model_validate(data).job_id == job_id
    else:
        with pytest.raises(ValidationError, match="job_id"):
            PlanRequest.model_validate(data)


def test_a_million_bad_entries_are_one_error() -> None:
    """A body of a million strings in ``lengths`` made a million errors: 97 MB of 422 and 18 s
    of the service's event loop (a hostile-input hunt, 2026-12-07)."""
    with pytest.raises(ValidationError) as caught:
        PlanRequest.model_validate({"lengths": ["a"] * 1_000_000})
    errors = caught.value.errors()
    assert len(errors) == 1
    assert errors[0]["loc"] == ("lengths",)
    assert "lengths[0] = 'a' is not an integer, nor are 999999 more" in errors[0]["msg"]
    with pytest.raises(ValidationError) as caught:
        PlanRequest.model_validate({"lengths": [1, 2.5, 3]})  # a few: one error each, as before
    assert [e["loc"] for e in caught.value.errors()] == [("lengths", 1)]


@pytest.mark.parametrize("where", ["", "cluster", "model", "profile"])
def test_half_a_million_unknown_keys_are_one_error(where: str) -> None:
    junk = {f"k{i}": 1 for i in range(500_000)}
    data: dict[str, Any] = {"lengths": [100]}
    if where:
        data[where] = junk
    else:
        data.update(junk)
    with pytest.raises(ValidationError) as caught:
        PlanRequest.model_validate(data)
    errors = caught.value.errors()
    assert len(errors) == 1
    assert "500000 unknown fields" in errors[0]["msg"]
    assert (" in " + where in errors[0]["msg"]) == bool(where)


@pytest.mark.parametrize("model", [StepMeasurement, Profile])
def test_other_bodies_of_many_unknown_keys_are_one_error(model: type[BaseModel]) -> None:
    """The measurement and profile bodies (and the service's feedback settings) too: 1.3
    million unknown keys held the event loop 6-8 s on their routes (a re-check hunt)."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate({f"k{i}": 1 for i in range(300_000)})
    assert len(caught.value.errors()) == 1
    assert "300000 unknown fields" in caught.value.errors()[0]["msg"]
