"""Render deploy/nginx/repack.conf.template for replicas on a bare host (tests, no Docker).

``python deploy/render_nginx.py --listen 127.0.0.1:8080 --replica 127.0.0.1:8001 --replica
127.0.0.1:8002 --dir /tmp/nginx`` writes ``/tmp/nginx/nginx.conf``, a complete unprivileged
configuration (pid, logs and temp files under the directory) that includes the rendered
template; run it with ``nginx -c /tmp/nginx/nginx.conf -p /tmp/nginx``. compose.yaml renders the
same template with the nginx image's envsubst.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from string import Template

TEMPLATE = Path(__file__).resolve().parent / "nginx" / "repack.conf.template"

MAIN = """worker_processes 1;
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


def upstream_servers(replicas: list[str]) -> str:
    """One ``server`` line per replica; a replica that failed once rests 5 s."""
    return "\n    ".join(f"server {r} max_fails=1 fail_timeout=5s;" for r in replicas)


def render(listen: str, replicas: list[str], directory: Path) -> Path:
    """Write ``nginx.conf`` and ``repack.conf`` under ``directory``; returns nginx.conf."""
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / "temp" / sub).mkdir(parents=True, exist_ok=True)
    site = Template(TEMPLATE.read_text()).safe_substitute(
        LISTEN=listen, SERVERS=upstream_servers(replicas)
    )
    (directory / "repack.conf").write_text(site)
    main = directory / "nginx.conf"
    main.write_text(MAIN.format(dir=directory.resolve()))
    return main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, help="address:port nginx listens on")
    parser.add_argument("--replica", action="append", required=True, help="host:port of one")
    parser.add_argument("--dir", type=Path, required=True, help="where the config is written")
    args = parser.parse_args()
    print(render(args.listen, args.replica, args.dir))


if __name__ == "__main__":
    main()
