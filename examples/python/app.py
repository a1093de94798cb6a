"""A demo service: GET /api/hello behind the rate limiter.

    VALKEY_ADDR=127.0.0.1:6379 uvicorn app:app --host 127.0.0.1 --port 8080

Configured from the environment (RL_KEY_BURST, RL_FAILURE_MODE, ...: see
README.md); create_app() takes a RateLimitConfig for tests and embedding.
"""

from __future__ import annotations

import contextlib
import os

from fastapi import FastAPI

from rate_limit import RateLimitConfig, RateLimiter, RateLimitMiddleware, make_client


def create_app(config: RateLimitConfig | None = None) -> FastAPI:
    config = config or RateLimitConfig.from_env()
    client = make_client(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)
    app.state.valkey = client
    # Everything under /api/ is limited; /healthz and the like are not.
    app.add_middleware(RateLimitMiddleware, limiter=RateLimiter(client, config), paths=("/api/",))

    @app.get("/api/hello")
    async def hello() -> dict:
        return {"message": "hello"}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True}

    return app


app = create_app()

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))
