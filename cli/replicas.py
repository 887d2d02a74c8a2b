"""Replicas of `repack serve` as real processes, and nginx in front of them, on one host.

Used by the scale-out test and the soak bench (`repack soak`): each replica is its own process
group (so a kill takes its solver workers too, like a container stop), writes its JSON log to a
file, and reports the resident memory of its whole process tree. nginx runs the configuration
users deploy (``deploy/nginx/repack.conf.template``), rendered for these replicas.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

NGINX_TEMPLATE = (
    Path(__file__).resolve().parent.parent / "deploy" / "nginx" / "repack.conf.template"
)
"""The http-level nginx configuration of deploy/ (present in a checkout)."""

READY_TIMEOUT_S = 120.0

NGINX_MAIN = """worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
daemon off;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/temp/body;
    proxy_temp_path {dir}/temp/proxy;
    fastcgi_temp_path {dir}/temp/fastcgi;
    uwsgi_temp_path {dir}/temp/uwsgi;
    scgi_temp_path {dir}/temp/scgi;
    include {dir}/repack.conf;
}}
"""
"""An unprivileged main configuration around the template (pid, logs, temp files in a dir)."""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, alive: subprocess.Popen[bytes], path: str = "/readyz") -> None:
    """Until ``url + path`` answers 200; raises if the process exits or time runs out."""
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if alive.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {alive.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}{path} not ready after {READY_TIMEOUT_S:.0f} s")


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and every descendant (Linux /proc; 0 when gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(c) for c in children)
    return total


@dataclass
class Replica:
    """One `repack serve` process group on a free loopback port."""

    database_url: str
    log_path: Path
    workers: int = 1
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Replica:
        env = {
            **os.environ,
            "REPACK_HOST": "127.0.0.1",
            "REPACK_PORT": str(self.port),
            "REPACK_DATABASE_URL": self.database_url,
            "REPACK_SOLVER_WORKERS": str(self.workers),
            "REPACK_LOG_FORMAT": "json",
            **self.env,
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill() takes the workers too
            )
        wait_ready(self.url, self.proc)
        return self

    def rss_bytes(self) -> int:
        return 0 if self.proc is None else tree_rss_bytes(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL the whole process group (service, forkserver, solver workers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def nginx_binary() -> str | None:
    """Debian's nginx (scripts/ensure-test-services.sh installs it), if present."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )


@dataclass
class Nginx:
    """nginx with deploy/'s configuration in front of ``replicas``, in its own directory."""

    directory: Path
    replicas: list[str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def render(self) -> Path:
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.directory / "temp" / sub).mkdir(parents=True, exist_ok=True)
        servers = "\n    ".join(f"server {r} max_fails=1 fail_timeout=5s;" for r in self.replicas)
        site = Template(NGINX_TEMPLATE.read_text()).safe_substitute(
            LISTEN=f"127.0.0.1:{self.port}", SERVERS=servers
        )
        (self.directory / "repack.conf").write_text(site)
        main = self.directory / "nginx.conf"
        main.write_text(NGINX_MAIN.format(dir=self.directory.resolve()))
        return main

    def start(self) -> Nginx:
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed (scripts/ensure-test-services.sh)")
        config = self.render()
        self.proc = subprocess.Popen(
            [binary, "-c", str(config), "-p", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        wait_ready(self.url, self.proc, "/healthz")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
