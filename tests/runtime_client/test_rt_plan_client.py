"""Plan client over real HTTP (a stdlib server calling the real planner): retries, timeouts,
fallback, prefetch, and agreement of every rank on one plan (forked gloo ranks)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest
from rt_service import PlanService, ServiceBehaviour, toy_request

from runtime_client.agreement import agree_on_plan, fetch_agreed_plan
from runtime_client.local_launch import RankFailure, run_local_ranks
from runtime_client.plan_client import (
    PlanClient,
    PlanClientConfig,
    PlanMismatchError,
    PlanServiceError,
    layout_digest,
)
from solver.planner import plan as local_plan


@pytest.fixture
def service() -> Iterator[PlanService]:
    svc = PlanService(ServiceBehaviour())
    yield svc
    svc.close()


def _client(
    url: str,
    *,
    timeout_s: float = 2.0,
    retries: int = 2,
    backoff_s: float = 0.01,
    fallback: bool = True,
) -> PlanClient:
    return PlanClient(
        PlanClientConfig(
            service_url=url,
            timeout_s=timeout_s,
            retries=retries,
            backoff_s=backoff_s,
            fallback=fallback,
        )
    )


def _closed_port_url() -> str:
    with socket.socket() as s:  # bind and release: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_service_plan_is_the_planners_plan(service: PlanService) -> None:
    request = toy_request(3)
    with _client(service.url) as client:
        got = client.get(request)
    assert got.source == "service" and got.attempts == 1 and got.error is None
    assert got.plan.job_id == "job" and got.plan.step == 3
    assert layout_digest(got.plan) == layout_digest(local_plan(request))
    assert client.stats.service_plans == 1 and client.stats.fallbacks == 0
    assert len(service.behaviour.seen) == 1


def test_retries_after_server_errors(service: PlanService) -> None:
    service.behaviour.fail_first = 2
    with _client(service.url, retries=3) as client:
        got = client.get(toy_request(1))
    assert got.source == "service" and got.attempts == 3
    assert client.stats.retries == 2 and client.stats.fallbacks == 0
    assert len(service.behaviour.seen) == 3


def test_429_retry_after_is_honoured(service: PlanService) -> None:
    service.behaviour.fail_first, service.behaviour.fail_status = 1, 429
    service.behaviour.retry_after = "0.3"
    with _client(service.url, retries=1, backoff_s=0.0) as client:
        got = client.get(toy_request(2))
    assert got.source == "service" and got.attempts == 2
    (t1, *_), (t2, *_) = service.behaviour.seen
    assert t2 - t1 >= 0.3  # waited Retry-After, not the (zero) backoff


def test_timeout_falls_back_loudly(service: PlanService, caplog: pytest.LogCaptureFixture) -> None:
    service.behaviour.delay_s = 0.5
    request = toy_request(4)
    with caplog.at_level(logging.WARNING), _client(service.url, timeout_s=0.1, retries=1) as c:
        got = c.get(request)
    assert got.source == "fallback" and got.attempts == 2
    assert got.error is not None and "Timeout" in got.error
    assert c.stats.fallbacks == 1 and c.stats.service_plans == 0
    assert any("local planner" in r.getMessage() for r in caplog.records)
    assert layout_digest(got.plan) == layout_digest(local_plan(request))


def test_connection_refused_falls_back() -> None:
    with _client(_closed_port_url(), retries=1) as client:
        got = client.get(toy_request(5))
    assert got.source == "fallback" and "ConnectError" in (got.error or "")
    assert client.stats.fallbacks == 1 and client.stats.retries == 1


def test_client_error_is_not_retried(service: PlanService) -> None:
    service.behaviour.fail_first, service.behaviour.fail_status = 10, 422
    with _client(service.url, retries=3) as client:
        got = client.get(toy_request(6))
    assert got.source == "fallback" and "HTTP 422" in (got.error or "")
    assert got.attempts == 1 and len(service.behaviour.seen) == 1


def test_mixed_up_response_is_rejected(service: PlanService) -> None:
    service.behaviour.wrong_step = True
    with _client(service.url, retries=0) as client:
        got = client.get(toy_request(7))
    assert got.source == "fallback" and "step 8" in (got.error or "")
    assert got.plan.step == 7


def test_no_fallback_raises(service: PlanService) -> None:
    service.behaviour.fail_first = 100
    with (
        _client(service.url, retries=1, fallback=False) as client,
        pytest.raises(PlanServiceError, match="HTTP 503"),
    ):
        client.get(toy_request(8))


def test_prefetch_fetches_ahead(service: PlanService) -> None:
    service.behaviour.delay_s = 0.05
    with _client(service.url) as client:
        for step in (10, 11, 12):
            client.prefetch(toy_request(step))
        client.prefetch(toy_request(10))  # already in flight: no second request
        deadline = time.monotonic() + 10
        while len(service.behaviour.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # the background threads fetch while this thread does nothing
        assert sorted(s or 0 for _, _, s in service.behaviour.seen) == [10, 11, 12]
        plans = [client.get(toy_request(step)) for step in (10, 11, 12)]
        assert len(service.behaviour.seen) == 3  # served from the prefetched results
        miss = client.get(toy_request(13))
    assert [p.plan.step for p in plans] == [10, 11, 12]
    assert client.stats.prefetch_hits == 3 and client.stats.prefetch_misses == 1
    assert miss.source == "service"


def test_fallback_plan_equals_service_plan_for_every_mode(service: PlanService) -> None:
    for mode in ("baseline", "repack", "repack+parent"):
        request = toy_request(20, mode=mode, job_id=f"job-{mode}")  # one idempotency key each
        with _client(service.url) as up, _client(_closed_port_url(), retries=0) as down:
            a, b = up.get(request), down.get(request)
        assert (a.source, b.source) == ("service", "fallback")
        assert layout_digest(a.plan) == layout_digest(b.plan)
        assert a.plan.plan_id == b.plan.plan_id == f"job-{mode}-20"
        assert a.plan.mode == mode


# --- every rank ends up with the same plan (forked gloo ranks) ---------------------------------


def _verify_worker(rank: int, world: int, good: str, bad: str) -> tuple[str, str]:
    # Half the ranks cannot reach the service and fall back; the layouts must still agree. The
    # generous timeout keeps a loaded machine from turning the service ranks into fallbacks too.
    with _client(good if rank % 2 else bad, retries=0, timeout_s=30.0) as client:
        fetched = fetch_agreed_plan(client, toy_request(30), strategy="verify")
    return fetched.source, layout_digest(fetched.plan).hex()


def test_verify_strategy_agrees_across_service_and_fallback(service: PlanService) -> None:
    results = run_local_ranks(_verify_worker, 4, service.url, _closed_port_url(), timeout_s=120)
    assert [s for s, _ in results] == ["fallback", "service", "fallback", "service"]
    assert len({d for _, d in results}) == 1


def _broadcast_worker(rank: int, world: int, url: str) -> tuple[str, str]:
    client = _client(url) if rank == 0 else None
    fetched = fetch_agreed_plan(client, toy_request(31), strategy="broadcast")
    if client is not None:
        client.close()
    return fetched.source, fetched.plan.model_dump_json()


def test_broadcast_strategy_sends_rank0s_plan(service: PlanService) -> None:
    results = run_local_ranks(_broadcast_worker, 4, service.url, timeout_s=120)
    assert [s for s, _ in results] == ["service", "broadcast", "broadcast", "broadcast"]
    assert len({text for _, text in results}) == 1  # byte-identical, solve_ms included
    assert len(service.behaviour.seen) == 1  # one request per step, not one per rank


def _mismatch_worker(rank: int, world: int) -> str:
    step = 41 if rank == 3 else 40  # rank 3 is a step ahead: a bug the check must catch
    try:
        agree_on_plan(local_plan(toy_request(step)))
    except PlanMismatchError as exc:
        return str(exc)
    return "agreed"


def test_mismatch_fails_loudly_on_every_rank() -> None:
    results = run_local_ranks(_mismatch_worker, 4, timeout_s=120)
    assert all("ranks disagree" in r and "[0, 1, 2]" in r and "[3]" in r for r in results)


def test_rank_failure_is_reported() -> None:
    def boom(rank: int, world: int) -> None:
        if rank == 1:
            raise ValueError("rank one fails")

    with pytest.raises(RankFailure, match="rank one fails"):
        run_local_ranks(boom, 2, timeout_s=60)


def _failing_worker(rank: int, world: int, good: str, bad: str, strategy: str) -> str:
    url = bad if rank == 1 or strategy == "broadcast" else good
    client = _client(url, retries=0, fallback=False) if strategy == "verify" or rank == 0 else None
    try:
        fetch_agreed_plan(client, toy_request(50), strategy=strategy)  # type: ignore[arg-type]
    except (PlanServiceError, PlanMismatchError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        if client is not None:
            client.close()
    return "no error"


@pytest.mark.parametrize("strategy", ["broadcast", "verify"])
def test_a_failed_fetch_fails_every_rank_instead_of_hanging(
    service: PlanService, strategy: str
) -> None:
    results = run_local_ranks(
        _failing_worker, 4, service.url, _closed_port_url(), strategy, timeout_s=120
    )
    assert all(r != "no error" for r in results), results
    if strategy == "broadcast":
        assert all("rank 0 has no plan" in r and "ConnectError" in r for r in results)
    else:
        assert results[1].startswith("PlanServiceError")
        assert all("no plan: ranks [1]" in r for i, r in enumerate(results) if i != 1)


def test_old_import_path_of_the_agreement_still_works() -> None:
    from runtime_client import agreement, plan_client

    assert plan_client.fetch_agreed_plan is agreement.fetch_agreed_plan
    assert plan_client.agree_on_plan is agreement.agree_on_plan
