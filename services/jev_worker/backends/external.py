"""external-http: the network runs in another server (a family's own, e.g. CLM's `clm-serve` in front of
its embeddings server); the worker POSTs each translated request there and maps what goes wrong to the
API's errors, never waiting past the deadline:

- the server refuses or drops the connection, or answers an error status -> 502 `backend_unavailable`
  naming the server and what it said;
- no answer within the deadline -> 504 `deadline_exceeded`;
- an answer that is not JSON -> 502.

Where: the recipe's `serving.options.endpoint` (the server's base URL, http or https); without it the
worker does not start (status 2). No model is loaded here, so there is no prefix state to reuse.
"""

from __future__ import annotations

import aiohttp

from jev_common.checkpoint_files import ServingError
from jev_common.errors import ExternalServerFailed, ExternalServerTimeout

from ..protocols import ExternalBackend

HEALTH_TIMEOUT_S = 2.0


class ExternalHTTP(ExternalBackend):
    """Answered through pipeline.ExternalPipeline: no local model, engine or scheduler here."""

    name = "external-http"
    prefix_reuse = "n/a: the network runs in the external server (serving.options.endpoint); no local prefix state"

    def __init__(self) -> None:
        self.endpoint: str | None = None
        self._session: aiohttp.ClientSession | None = None

    def check(self, recipe) -> None:
        endpoint = (recipe.serving.options or {}).get("endpoint")
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            raise ServingError(
                f"backend {self.name!r} needs serving.options.endpoint, the external server's "
                f"http(s) base URL; recipe {recipe.name} has {endpoint!r}"
            )
        self.endpoint = endpoint.rstrip("/")

    def l3_bytes(self, configured: int) -> int:
        return 0

    def describe(self) -> dict:
        return {**super().describe(), "endpoint": self.endpoint}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(self, path: str, body: dict, timeout_s: float) -> dict:
        """The server's JSON answer to `body`, or ExternalServerFailed / ExternalServerTimeout (502 / 504)."""
        url = f"{self.endpoint}{path}"
        try:
            async with self._client().post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                text = await response.text()
                if response.status != 200:
                    raise ExternalServerFailed(
                        f"the external server {url} answered HTTP {response.status}: {text[:300]}"
                    )
                try:
                    return await response.json(content_type=None)
                except ValueError:
                    raise ExternalServerFailed(f"the external server {url} answered non-JSON: {text[:120]!r}") from None
        except TimeoutError:
            raise ExternalServerTimeout(f"the external server {url} gave no answer within {timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise ExternalServerFailed(
                f"the external server {url} cannot be reached: {type(exc).__name__}: {exc}"
            ) from None

    async def health(self, path: str = "/health") -> tuple[bool, object]:
        """(reachable with 200, its JSON body or the reason it is not), within HEALTH_TIMEOUT_S."""
        url = f"{self.endpoint}{path}"
        try:
            async with self._client().get(url, timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as response:
                if response.status != 200:
                    return False, f"{url} answered HTTP {response.status}"
                return True, await response.json(content_type=None)
        except TimeoutError:
            return False, f"{url} gave no answer within {HEALTH_TIMEOUT_S:g} s"
        except (aiohttp.ClientError, ValueError) as exc:
            return False, f"{url} cannot be reached: {type(exc).__name__}: {exc}"
