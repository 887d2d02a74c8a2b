"""`repack token NAME [--jobs PATTERN ...]`: make a bearer token and its tokens-file entry.

The token is printed once, on stdout, for the client (``REPACK_TOKEN``); the entry printed on
stderr holds only its SHA-256, for the service's ``REPACK_TOKENS_FILE`` (see docs/api.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import sys

TOKEN_BYTES = 32
"""256 bits of randomness, URL-safe base64: not guessable, safe in a header."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("token", help="make a bearer token and its tokens-file entry")
    p.add_argument("name", help="who holds the token (log lines and the rate limit use it)")
    p.add_argument(
        "--jobs",
        nargs="+",
        default=["*"],
        metavar="PATTERN",
        help="job ids it may plan and read, fnmatch patterns (default: * = all jobs)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    token = "rpk_" + secrets.token_urlsafe(TOKEN_BYTES)
    entry = {
        "name": args.name,
        "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "jobs": args.jobs,
    }
    print(token)
    print(f"add to REPACK_TOKENS_FILE under 'tokens:'\n  - {json.dumps(entry)}", file=sys.stderr)
    return 0
