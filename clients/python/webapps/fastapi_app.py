"""A FastAPI app limited by slowapi on valkey-ratelimit: only the storage URI changes.

RATELIMIT_STORAGE_URI=valkey-ratelimit://127.0.0.1:6379 uvicorn --workers 3 fastapi_app:app
"""

from __future__ import annotations

import os

from fastapi import FastAPI, Request, Response
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address

import valkey_ratelimit.limits  # noqa: F401 -- registers the valkey-ratelimit:// schemes

limiter = Limiter(
    key_func=get_remote_address,
    storage_uri=os.environ.get("RATELIMIT_STORAGE_URI", "valkey-ratelimit://127.0.0.1:6379"),
    strategy=os.environ.get("RATELIMIT_STRATEGY", "sliding-window-counter"),
    headers_enabled=True,
)
app = FastAPI()
app.state.limiter = limiter
app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]


@app.get("/hello")
@limiter.limit(os.environ.get("RATELIMIT", "20 per 4 seconds"))
async def hello(request: Request, response: Response) -> dict[str, str]:
    return {"message": "hello"}


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}
