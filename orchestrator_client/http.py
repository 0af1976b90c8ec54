"""The HTTP side of ``Client``: one logical call sent, retried and read, and the
paging of lists.

- **Errors** are exceptions (``orchestrator_client.errors``) carrying the API's ``code``,
  ``message``, ``details`` and the HTTP ``status``.
- **Retries.** Every POST carries an ``Idempotency-Key``, one per logical call, sent again
  on each retry of that call, so the server applies it once whatever happens to the
  answers (docs/api.md, "Idempotency"). A call is retried, up to ``retries`` times with
  exponential backoff (``backoff`` doubling up to ``max_backoff``, with jitter), when the
  server could not be reached or the connection broke, on 502, 503 and 504, on 429 (after
  its ``Retry-After``), and on 409 ``idempotency_key_in_use`` (a retry that overtook the
  first request, still running). The two POSTs the API does not key (a multipart upload,
  a callback) are retried only when nothing can have happened: the connection was never
  made, or the answer was 429 or 503.
- **Lists** are ``Paginator``s: iterate them for every item, following ``next`` links;
  nothing is fetched until then.
"""

from __future__ import annotations

import email.utils
import random
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal, Self
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from orchestrator_client._version import __version__
from orchestrator_client.errors import ApiError, TransportError, error_class
from orchestrator_client.pagination import Paginator
from orchestrator_client.plans import PlanFormat, at_plan_positions, json_body_with, yaml_body_with

API_PREFIX = "/api/v1"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# A POST the server does not key may have run before a 502 or 504 came back: only these
# answers say for sure that nothing was done.
UNKEYED_RETRY_STATUSES = frozenset({429, 503})
IN_USE = "idempotency_key_in_use"

# How a call may be retried: "keyed" (GET, PUT, DELETE and POSTs with an
# Idempotency-Key: a repeat does nothing new), "unkeyed" (a POST without one).
RetryMode = Literal["keyed", "unkeyed"]


def api_root(url: str) -> str:
    """The server's root URL from what a person typed (with or without ``/api/v1``)."""
    root = url.strip().rstrip("/")
    if root.endswith(API_PREFIX):
        root = root[: -len(API_PREFIX)]
    if not root.startswith(("http://", "https://")):
        raise ValueError(f"the URL must start with http:// or https://, not {url!r}")
    return root


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from(response: httpx.Response) -> ApiError:
    status = response.status_code
    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        code = body["code"]
        message = str(body.get("message") or code)
        details = body.get("details")
    else:
        # Not the API's own answer (a proxy's error page, a server that is not ours).
        code = f"http_{status}"
        text = " ".join(str(body).split())[:200]
        message = f"{response.reason_phrase or 'HTTP error'}" + (f": {text}" if text else "")
        details = None
    return error_class(status, code)(
        status=status,
        code=code,
        message=message,
        details=details,
        retry_after=retry_after,
        body=body,
    )


def decoded(response: httpx.Response) -> Any:
    """A successful answer's JSON; an ``ApiError`` (``invalid_response``) when it is not
    JSON (the URL points at a server that is not the API)."""
    try:
        return response.json()
    except ValueError as exc:
        text = " ".join(response.text.split())[:200]
        raise ApiError(
            status=response.status_code,
            code="invalid_response",
            message=f"the answer to {response.request.method} {response.request.url} is not "
            f"JSON (is this the orchestrator's URL?): {text}",
            body=response.text,
        ) from exc


def segment(value: object) -> str:
    """A path segment: ids and names are quoted, never trusted to be URL-safe."""
    return quote(str(value), safe="")


class HttpClient:
    """The API of one server, with one API key.

    ``url`` is the server's root (``http://127.0.0.1:8000``; a trailing ``/api/v1`` is
    accepted too). ``timeout`` is seconds per request; ``retries`` how many times a call
    is tried again after a transient failure (0: never). ``transport`` and ``sleep`` are
    for tests (an httpx transport, and what waits between tries).
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = api_root(url)
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": f"orchestrator-client/{__version__}",
            },
            timeout=timeout,
            transport=transport,
        )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def _delay(self, attempt: int) -> float:
        """Exponential backoff with jitter: about backoff * 2**attempt, capped."""
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling * (0.5 + random.random() / 2)  # noqa: S311 (jitter, not a secret)

    def _same_origin(self, url: str) -> str:
        """A ``next`` link on this server: its host replaced by ours if it differs (a
        proxy that rewrote the Host), so the API key never goes anywhere else."""
        link, base = urlsplit(url), urlsplit(self.url)
        if (link.scheme, link.netloc) == (base.scheme, base.netloc):
            return url
        return urlunsplit((base.scheme, base.netloc, link.path, link.query, ""))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        files: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        retry: RetryMode = "keyed",
        authenticated: bool = True,
        rewind: Callable[[], None] | None = None,
        follow_redirects: bool = False,
    ) -> httpx.Response:
        """Send one logical call, retrying as the module says; the successful answer,
        or the error raised. ``path`` is relative to ``/api/v1`` or an absolute URL."""
        send_headers = dict(headers or {})
        if idempotency_key is not None:
            send_headers["Idempotency-Key"] = idempotency_key
        if path.startswith(("http://", "https://")):
            path = self._same_origin(path)
        retry_statuses = RETRY_STATUSES if retry == "keyed" else UNKEYED_RETRY_STATUSES
        attempt = 0
        while True:
            if attempt and rewind is not None:
                rewind()
            request = self._http.build_request(
                method,
                path,
                params=dict(params) if params is not None else None,
                json=json,
                content=content,
                files=files,
                data=data,
                headers=send_headers,
            )
            if not authenticated:
                del request.headers["Authorization"]
            try:
                response = self._http.send(request, follow_redirects=follow_redirects)
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                transient = isinstance(
                    exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError
                )
                if transient and (retry == "keyed" or never_sent) and attempt < self.retries:
                    self._sleep(self._delay(attempt))
                    attempt += 1
                    continue
                raise TransportError(
                    f"{method} {request.url}: {exc or type(exc).__name__}"
                ) from exc
            if response.is_success or response.is_redirect:
                return response
            error = error_from(response)
            retryable = response.status_code in retry_statuses or (
                error.code == IN_USE and idempotency_key is not None
            )
            if not retryable or attempt >= self.retries:
                raise error
            wait = error.retry_after
            if wait is not None and wait > self.max_retry_after:
                raise error  # told to come back later than we are willing to wait
            self._sleep(wait if wait is not None else self._delay(attempt))
            attempt += 1

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return decoded(self.request("GET", path, params=params))

    def _post(self, path: str, body: Mapping[str, Any] | None = None, **options: Any) -> Any:
        key = options.pop("idempotency_key", None) or str(uuid.uuid4())
        payload = {k: v for k, v in (body or {}).items() if v is not None}
        return decoded(self.request("POST", path, json=payload, idempotency_key=key, **options))

    def _pages(self, path: str, params: Mapping[str, Any] | None, limit: int | None) -> Any:
        def fetch(target: str, query: dict[str, Any] | None) -> Any:
            return self._get(target, query)

        return Paginator(fetch, path, dict(params or {}), limit=limit)

    def _post_plan_text(
        self,
        route: str,
        text: str,
        format: PlanFormat,
        fields: dict[str, Any],
        idempotency_key: str | None,
    ) -> Any:
        """POST ``fields`` and the plan as written. A refusal to parse it says where in
        the plan, not in the body around it (``plans.at_plan_positions``)."""
        if format == "yaml":
            content, media = yaml_body_with(text, fields), "application/yaml"
        else:
            content, media = json_body_with(text, fields), "application/json"
        try:
            response = self.request(
                "POST",
                route,
                content=content.encode("utf-8"),
                headers={"Content-Type": media},
                idempotency_key=idempotency_key or str(uuid.uuid4()),
            )
        except ApiError as exc:
            if exc.code in ("invalid_json", "invalid_yaml"):
                exc.message = at_plan_positions(exc.message, format=format, fields=fields)
                exc.args = (exc.message,)
            raise
        return decoded(response)
