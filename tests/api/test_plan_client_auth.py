"""The plan client authenticates with its token (config or ``REPACK_TOKEN``) and names the job
in a header for the balancer, against a real server that requires tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_client.plan_client import (
    JOB_HEADER,
    PlanClient,
    PlanClientConfig,
    PlanServiceError,
    job_header,
)
from solver.schema import PlanRequest
from tests.api.conftest import ServerFactory, small_request
from tests.api.test_auth import LOADER, write_tokens


@pytest.fixture
def secured_url(tmp_path: Path, start_server: ServerFactory) -> str:
    db = f"sqlite:///{tmp_path / 'plans.db'}"
    return start_server(db, tokens_file=write_tokens(tmp_path / "tokens.json")).url


def config(url: str, **kw: object) -> PlanClientConfig:
    return PlanClientConfig(service_url=url, fallback=False, retries=0, **kw)  # type: ignore[arg-type]


def test_the_client_sends_its_token(secured_url: str) -> None:
    request = PlanRequest.model_validate(small_request("llama-7", 0))
    with PlanClient(config(secured_url, token=LOADER)) as client:
        fetched = client.fetch(request)
    assert fetched.source == "service"
    assert (fetched.plan.job_id, fetched.plan.step) == ("llama-7", 0)
    with (
        PlanClient(config(secured_url, token=None)) as client,
        pytest.raises(PlanServiceError, match="HTTP 401"),
    ):
        client.fetch(request)


def test_the_token_comes_from_the_environment(
    secured_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPACK_TOKEN", LOADER)
    cfg = config(secured_url)
    assert cfg.token == LOADER and LOADER not in repr(cfg)
    request = PlanRequest.model_validate(small_request("llama-8", 1))
    with PlanClient(cfg) as client:
        assert client.fetch(request).source == "service"
    other = PlanRequest.model_validate(small_request("gpt-8", 1))
    with PlanClient(cfg) as client, pytest.raises(PlanServiceError, match="HTTP 403"):
        client.fetch(other)


def test_the_job_header_is_percent_encoded() -> None:
    named = PlanRequest.model_validate(small_request("ジョブ 1", 0))
    assert job_header(named) == {JOB_HEADER: "%E3%82%B8%E3%83%A7%E3%83%96%201"}
    assert job_header(PlanRequest.model_validate({"lengths": [1]})) == {}
