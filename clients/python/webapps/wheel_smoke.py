"""After ``pip install valkey_ratelimit-*.whl[limits] Flask-Limiter`` into a fresh venv: a Flask-Limiter
app with the new URI works. Run by scripts/test-clients.sh with that venv's python; exits non-zero
on failure."""

from __future__ import annotations

import sys

from flask import Flask
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from servers import Server

import valkey_ratelimit.limits  # noqa: F401 -- registers valkey-ratelimit://


def main() -> int:
    with Server() as server:
        app = Flask(__name__)
        limiter = Limiter(
            get_remote_address,
            app=app,
            storage_uri=f"valkey-ratelimit://127.0.0.1:{server.port}",
            strategy="moving-window",
            headers_enabled=True,
        )

        @app.get("/")
        @limiter.limit("2 per minute")
        def index() -> str:
            return "ok"

        client = app.test_client()
        statuses = [client.get("/").status_code for _ in range(3)]
        denied = client.get("/")
        keys = server.client.keys("LIMITS*")
    ok = statuses == [200, 200, 429] and denied.headers.get("Retry-After") is not None and len(keys) == 1
    print(f"wheel smoke: statuses {statuses}, Retry-After {denied.headers.get('Retry-After')}, keys {keys}")
    print("wheel smoke: PASS" if ok else "wheel smoke: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
