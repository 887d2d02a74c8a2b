"""Bearer tokens with per-job scope, the rate limit, security headers and local Swagger UI,
over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from api.settings import Settings
from tests.api.conftest import ServerFactory, metric_value, small_request

LOADER = "rpk_loader-token"
OPS = "rpk_ops-token"


def write_tokens(path: Path) -> Path:
    entries = [
        {
            "name": "loader",
            "sha256": hashlib.sha256(LOADER.encode()).hexdigest(),
            "jobs": ["llama-*"],
        },
        {"name": "ops", "sha256": hashlib.sha256(OPS.encode()).hexdigest(), "jobs": ["*"]},
    ]
    path.write_text(json.dumps({"tokens": entries}))
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def secured(tmp_path: Path, start_server: ServerFactory) -> str:
    server = start_server(
        f"sqlite:///{tmp_path / 'plans.db'}", tokens_file=write_tokens(tmp_path / "tokens.json")
    )
    return server.url


def test_tokens_are_required_and_scoped_per_job(secured: str) -> None:
    with httpx.Client(base_url=secured, timeout=60) as c:
        anonymous = c.post("/v1/plans", json=small_request("llama-1", 0))
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        assert anonymous.headers["content-type"] == "application/problem+json"
        assert (
            c.post("/v1/plans", json=small_request("llama-1", 0), headers=bearer("x")).status_code
            == 401
        )

        mine = c.post("/v1/plans", json=small_request("llama-1", 0), headers=bearer(LOADER))
        assert mine.status_code == 200
        other = c.post("/v1/plans", json=small_request("gpt-1", 0), headers=bearer(LOADER))
        assert other.status_code == 403 and "gpt-1" in other.json()["detail"]
        assert (
            c.post("/v1/plans", json=small_request("gpt-1", 0), headers=bearer(OPS)).status_code
            == 200
        )

        # Reading: the loader sees its job's plans, another job's plan looks absent.
        assert c.get("/v1/plans/llama-1-0", headers=bearer(LOADER)).content == mine.content
        assert c.get("/v1/plans/gpt-1-0", headers=bearer(LOADER)).status_code == 404
        assert c.get("/v1/plans/gpt-1-0", headers=bearer(OPS)).status_code == 200
        assert c.get("/v1/plans/gpt-1-0").status_code == 401
        assert c.get("/v1/jobs/llama-1/steps", headers=bearer(LOADER)).status_code == 200
        assert c.get("/v1/jobs/gpt-1/steps", headers=bearer(LOADER)).status_code == 403
        assert c.get("/v1/jobs", headers=bearer(LOADER)).status_code == 403
        jobs = c.get("/v1/jobs", headers=bearer(OPS)).json()["items"]
        assert [j["job_id"] for j in jobs] == ["gpt-1", "llama-1"]

        # Probes and metrics stay open for the orchestrator and Prometheus.
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        assert c.get("/metrics").status_code == 200


def test_the_dashboard_takes_the_token_as_a_basic_password(secured: str) -> None:
    with httpx.Client(base_url=secured, timeout=60) as c:
        c.post("/v1/plans", json=small_request("llama-1", 0), headers=bearer(LOADER))
        page = c.get("/dashboard")
        assert page.status_code == 401
        assert page.headers["www-authenticate"] == 'Basic realm="repack"'
        basic = base64.b64encode(f"ops:{OPS}".encode()).decode()
        assert c.get("/dashboard", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        loader = base64.b64encode(f"me:{LOADER}".encode()).decode()
        auth = {"Authorization": f"Basic {loader}"}
        assert c.get("/dashboard/jobs/llama-1", headers=auth).status_code == 200
        assert c.get("/dashboard", headers=auth).status_code == 403
        assert c.get("/dashboard", headers={"Authorization": "Basic !!"}).status_code == 401


def test_rate_limit_per_client_answers_429_with_retry_after(
    tmp_path: Path, start_server: ServerFactory
) -> None:
    server = start_server(
        f"sqlite:///{tmp_path / 'plans.db'}",
        tokens_file=write_tokens(tmp_path / "tokens.json"),
        rate_limit="3/minute",
    )
    with httpx.Client(base_url=server.url, timeout=60) as c:
        codes = [c.get("/v1/plans/llama-x-0", headers=bearer(LOADER)).status_code for _ in range(4)]
        assert codes == [404, 404, 404, 429]
        limited = c.get("/v1/plans/llama-x-0", headers=bearer(LOADER))
        assert limited.status_code == 429
        assert 1 <= int(limited.headers["retry-after"]) <= 61
        # Another client has its own budget.
        assert c.get("/v1/plans/x-0", headers=bearer(OPS)).status_code == 404
        text = c.get("/metrics").text
        assert metric_value(text, "repack_rejected_total", reason="rate_limit") == 2


def test_security_headers_and_local_swagger_ui(client: httpx.Client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    for header in ("x-content-type-options", "x-frame-options", "content-security-policy"):
        assert header in page.headers
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "cdn" not in page.text.lower()
    assert "/docs/assets/swagger-ui-bundle.js" in page.text
    js = client.get("/docs/assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 100_000
    assert client.get("/docs/assets/swagger-ui.css").status_code == 200
    assert client.get("/redoc").status_code == 404
    assert client.post("/v1/plans", json={"lengths": []}).headers["x-frame-options"] == "DENY"


def test_openapi_carries_the_package_version(client: httpx.Client) -> None:
    from solver.version import package_version

    assert client.get("/openapi.json").json()["info"]["version"] == package_version()


def test_anonymous_access_needs_a_loopback_bind_or_an_explicit_yes(tmp_path: Path) -> None:
    assert Settings(host="127.0.0.1").anonymous_allowed
    with pytest.raises(ValidationError, match="REPACK_ALLOW_ANONYMOUS"):
        Settings(host="0.0.0.0")
    assert Settings(host="0.0.0.0", allow_anonymous=True).anonymous_allowed
    tokens = write_tokens(tmp_path / "t.json")
    assert not Settings(host="0.0.0.0", tokens_file=tokens).anonymous_allowed
    assert not Settings(host="127.0.0.1", tokens_file=tokens).anonymous_allowed


def test_a_bad_tokens_file_is_one_line_at_startup(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.yaml"
    bad.write_text("tokens:\n  - {name: a, sha256: 'plaintext-token', jobs: ['*']}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--port", "0"],
        env={"REPACK_TOKENS_FILE": str(bad), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "sha256" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_repack_token_prints_a_token_and_only_its_hash(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "token", "loader", "--jobs", "llama-*"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = proc.stdout.strip()
    entry = json.loads(proc.stderr.strip().splitlines()[-1].removeprefix("  - "))
    assert entry == {
        "name": "loader",
        "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "jobs": ["llama-*"],
    }
    assert token not in proc.stderr
