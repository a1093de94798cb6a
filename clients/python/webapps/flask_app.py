"""A Flask app limited by Flask-Limiter on valkey-ratelimit: only the storage URI changes.

RATELIMIT_STORAGE_URI=valkey-ratelimit://127.0.0.1:6379 gunicorn -w 3 flask_app:app
"""

from __future__ import annotations

import os

from flask import Flask
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

import valkey_ratelimit.limits  # noqa: F401 -- registers the valkey-ratelimit:// schemes

app = Flask(__name__)
limiter = Limiter(
    get_remote_address,
    app=app,
    storage_uri=os.environ.get("RATELIMIT_STORAGE_URI", "valkey-ratelimit://127.0.0.1:6379"),
    strategy=os.environ.get("RATELIMIT_STRATEGY", "moving-window"),
    headers_enabled=True,
)


@app.get("/hello")
@limiter.limit(os.environ.get("RATELIMIT", "20 per 4 seconds"))
def hello() -> dict[str, str]:
    return {"message": "hello"}


@app.get("/healthz")
@limiter.exempt
def healthz() -> dict[str, bool]:
    return {"ok": True}
