"""The shared bad-input handler: one line per error, whatever raised it."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from cli.errors import EXIT_BAD_INPUT, describe, format_loc, guarded
from solver.errors import PlanningError
from solver.schema import PlanRequest


def _validation_error(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        PlanRequest.model_validate(data)
    return info.value


@pytest.mark.parametrize(
    ("loc", "text"),
    [(("lengths", 3), "lengths[3]"), (("cluster", "nodes"), "cluster.nodes"), ((), "")],
)
def test_format_loc(loc: tuple[int | str, ...], text: str) -> None:
    assert format_loc(loc) == text


def test_describe_validation_errors() -> None:
    assert describe(_validation_error({"lengths": [1, 0]})) == "lengths[1] = 0 must be >= 1"
    assert describe(_validation_error({"lengths": [1], "x": 1})) == "unknown field x"
    assert describe(_validation_error({})) == "lengths: required field is missing"
    two = _validation_error({"lengths": [1], "x": 1, "y": 2})
    assert describe(two) == "unknown fields x, y"


def test_a_misspelled_field_is_named_before_the_field_it_leaves_missing() -> None:
    typo = _validation_error({"cluster": {"nodes": 2}, "lenghts": [1]})
    assert describe(typo) == (
        "unknown field lenghts (and 1 more error: lengths: required field is missing)"
    )
    nested = _validation_error({"lengths": [1], "cluster": {"nodse": 2}})
    assert describe(nested) == "unknown field cluster.nodse"


def test_describe_parse_errors_and_notes() -> None:
    with pytest.raises(json.JSONDecodeError) as bad_json:
        json.loads('{"a": }')
    assert describe(bad_json.value).startswith("invalid JSON at line 1 column 7:")
    with pytest.raises(yaml.YAMLError) as bad_yaml:
        yaml.safe_load("a: [1\nb: 2")
    assert describe(bad_yaml.value).startswith("invalid YAML at line 2")
    error = PlanningError("lengths", "no uniform parent size fits")
    error.add_note("in req.json")
    assert describe(error) == "lengths: no uniform parent size fits (in req.json)"
    assert "\n" not in describe(bad_yaml.value)


def test_guarded_maps_input_errors_and_keeps_bugs(capsys: pytest.CaptureFixture[str]) -> None:
    def missing(_: object) -> int:
        return open("/nonexistent/req.json").close() or 0  # type: ignore[func-returns-value]

    assert guarded(missing)(None) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == "repack: error: /nonexistent/req.json: No such file or directory\n"

    def bug(_: object) -> int:
        raise ZeroDivisionError("a bug keeps its traceback")

    with pytest.raises(ZeroDivisionError):
        guarded(bug)(None)
