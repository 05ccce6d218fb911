"""The typed HTTP client of the ffdl API: requests, error mapping, downloads and event streams.

Every failure reaches the caller as ``ApiError``: the server's error bodies (FfDL's
``{"code": <status>, "error", "description"}`` with ffdl's ``ffdl_code`` and ``detail``) keep
their ffdl code, and a server that cannot be reached becomes an ``ApiError`` that names its
URL, so callers never have to handle ``httpx`` exceptions.

A ``503`` (the platform's database is away, a failover say) is waited out: the request is
sent again after the answer's ``Retry-After`` (or a doubling delay), for at most
``unavailable_wait_s`` in all, and only then raised. The server answers 503 only for a
request it did not carry out, and a submit carries an ``Idempotency-Key``, so sending one
again is safe.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from ffdl.client.archive import model_definition_bytes
from ffdl.core.errors import BadRequest, FfdlError
from ffdl.core.tls import client_context, verification_failure

UNREACHABLE = "UNREACHABLE"
# An HTTPS server whose certificate does not verify (unknown CA, wrong host, expired).
UNTRUSTED = "UNTRUSTED_CERTIFICATE"
BAD_RESPONSE = "BAD_RESPONSE"
# A submit is retried this many times (after the first try) when the server cannot be
# reached or its answer is lost, waiting 0.5, 1, 2, 4, 8 s: long enough for a restart.
SUBMIT_RETRIES = 5
# Idle connections are dropped well before the server closes them (its default: after 5 s):
# a request sent on a connection the server is closing at that moment fails with a reset.
KEEPALIVE_S = 2.0
SUBMIT_RETRY_DELAY_S = 0.5
SUBMIT_RETRY_DELAY_MAX_S = 8.0
# Answers of a proxy whose server is away: the key makes retrying them safe too.
RETRY_HTTP_STATUSES = frozenset({502, 503, 504})
# How long a request waits out a platform whose database is away (503) before failing:
# longer than a PostgreSQL failover or restart takes.
UNAVAILABLE_WAIT_S = 180.0
UNAVAILABLE_DELAY_S = 0.5
UNAVAILABLE_DELAY_MAX_S = 5.0

RetryNotice = Callable[["ApiError", float], None]


class ApiError(FfdlError):
    """An error reported by the server, or the failure to reach it (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None) -> None:
        super().__init__(message, code=code, detail=detail)
        self.status = status
        self.http_status = status


class _StreamUnavailable(Exception):
    """An event stream refused with 503: reconnected like a dropped one."""


@dataclass(frozen=True, slots=True)
class FollowEvent:
    """One server-sent event of a job: ``log``, ``status``, ``emetric`` or ``end``."""

    kind: str
    data: dict[str, Any]


def error_from_response(response: httpx.Response) -> ApiError:
    """The ``ApiError`` for an error response whose body has been read."""
    status = response.status_code
    fallback_code = f"HTTP{status}"
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        # FfDL's shape: ``description`` is the message (``error`` only the status phrase) and
        # ``code`` the HTTP status; ffdl adds its own code as ``ffdl_code``. Older ffdl servers
        # sent the message as ``error`` and their code as ``code``.
        description = body.get("description")
        message = description if isinstance(description, str) and description else body["error"]
        code = body.get("ffdl_code")
        if not isinstance(code, str) or not code:
            legacy = body.get("code")
            code = legacy if isinstance(legacy, str) and legacy else fallback_code
        return ApiError(status, code, message, body.get("detail"))
    if isinstance(body, dict) and "detail" in body:
        # The web framework's own rejections (e.g. request validation) carry only ``detail``.
        detail = body["detail"]
        message = detail if isinstance(detail, str) else f"request rejected ({status})"
        return ApiError(status, fallback_code, message, detail)
    text = response.text.strip()
    return ApiError(status, fallback_code, text[:300] or f"{status} {response.reason_phrase}")


def iter_sse(lines: Iterable[str]) -> Iterator[tuple[str, str] | None]:
    """Server-sent events as ``(event, data)``; ``None`` for each keep-alive comment line."""
    kind = ""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield (kind or "message", "\n".join(data))
            kind = ""
            data = []
            continue
        if line.startswith(":"):
            yield None
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            kind = value
        elif field == "data":
            data.append(value)


def retry_after_s(response: httpx.Response) -> float | None:
    """The seconds of a ``Retry-After`` header given in seconds (not as a date); else None."""
    value = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class _UnavailableWait:
    """Waits out 503 answers to one request, within a time budget."""

    def __init__(self, budget_s: float, notice: RetryNotice | None) -> None:
        self._give_up_at = time.monotonic() + budget_s
        self._delay = UNAVAILABLE_DELAY_S
        self._notice = notice

    def wait(self, response: httpx.Response, error: ApiError) -> bool:
        """Sleep before the next try and say True; False when the request should fail now."""
        if response.status_code != 503:
            return False
        left = self._give_up_at - time.monotonic()
        if left <= 0:
            return False
        asked = retry_after_s(response)
        delay = min(self._delay if asked is None else asked, left)
        if self._notice is not None:
            self._notice(error, delay)
        time.sleep(delay)
        self._delay = min(self._delay * 2, UNAVAILABLE_DELAY_MAX_S)
        return True


def new_idempotency_key() -> str:
    """A fresh key for one submit: 128 random bits, URL-safe."""
    return secrets.token_urlsafe(16)


def _event_data(raw: str) -> dict[str, Any]:
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        return {"raw": raw}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _log_rindex(data: dict[str, Any]) -> int | None:
    meta = data.get("meta")
    if not isinstance(meta, dict):
        return None
    try:
        return int(meta["rindex"])
    except (KeyError, TypeError, ValueError):
        return None


def _page_items(body: dict[str, Any], legacy_key: str) -> list[dict[str, Any]]:
    """The items of a loglines/emetrics page: FfDL's ``models`` (``legacy_key`` from older
    ffdl servers)."""
    items = body.get("models", body.get(legacy_key))
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


class Client:
    """A connection to one ffdl server, authenticated with a bearer token or ``auth``."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 30.0,
        auth: httpx.Auth | None = None,
        unavailable_wait_s: float = UNAVAILABLE_WAIT_S,
        on_unavailable: RetryNotice | None = None,
        ca_bundle: Path | None = None,
    ) -> None:
        """``unavailable_wait_s``: how long to wait out 503 answers (0: not at all);
        ``on_unavailable(error, delay)`` is told before each such wait. ``ca_bundle``: the
        CA that verifies an HTTPS server (default: the system's trust store); ``TlsError``
        when it cannot be read."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.unavailable_wait_s = unavailable_wait_s
        self.on_unavailable = on_unavailable
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # ``auth`` (e.g. HTTP Basic from FfDL's DLAAS_USERNAME/DLAAS_PASSWORD) when no token.
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            transport=transport,
            timeout=timeout,
            auth=None if token else auth,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
            verify=client_context(ca_bundle) if ca_bundle is not None else True,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _transport_error(self, exc: httpx.TransportError) -> ApiError:
        if (untrusted := verification_failure(exc)) is not None:
            return ApiError(
                0,
                UNTRUSTED,
                f"the ffdl server at {self.url} presented a certificate this client does not "
                f"trust ({untrusted.verify_message or untrusted.reason}); if a private CA "
                "signed it, set FFDL_CA_BUNDLE to that CA's certificate file",
            )
        if isinstance(exc, httpx.ConnectError):
            return ApiError(
                0,
                UNREACHABLE,
                f"the ffdl server at {self.url} is unreachable ({exc}); "
                "start one with `ffdl up` or check FFDL_URL",
            )
        if isinstance(exc, httpx.TimeoutException):
            return ApiError(
                0, UNREACHABLE, f"the ffdl server at {self.url} did not answer in {self.timeout} s"
            )
        return ApiError(
            0, UNREACHABLE, f"connection to the ffdl server at {self.url} failed: {exc}"
        )

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        waiting = _UnavailableWait(self.unavailable_wait_s, self.on_unavailable)
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise self._transport_error(exc) from exc
            if not response.is_error:
                return response
            error = error_from_response(response)
            if not waiting.wait(response, error):
                raise error

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._send(method, path, **kwargs)
        try:
            body: Any = response.json()
        except ValueError as exc:
            raise ApiError(
                response.status_code, BAD_RESPONSE, f"{method} {path}: the server sent no JSON"
            ) from exc
        if not isinstance(body, dict):
            raise ApiError(
                response.status_code, BAD_RESPONSE, f"{method} {path}: expected a JSON object"
            )
        return body

    @staticmethod
    def _model_path(model_id: str, suffix: str = "") -> str:
        return f"/v1/models/{quote(model_id, safe='')}{suffix}"

    # -- API --------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/health")

    def submit(
        self,
        manifest: Path,
        code: Path,
        *,
        idempotency_key: str | None = None,
        retries: int = SUBMIT_RETRIES,
        retry_delay: float = SUBMIT_RETRY_DELAY_S,
        on_retry: RetryNotice | None = None,
    ) -> dict[str, Any]:
        """Submit a training job: ``manifest`` (YAML) and ``code`` (a directory or a .zip).

        The submit carries an ``Idempotency-Key`` (``idempotency_key``, or a fresh one) and
        is retried with the same key, up to ``retries`` times with doubling delays, when the
        server cannot be reached, the answer is lost, or a proxy says the server is away:
        the server answers a retry of a submit it already stored with that job, so a retry
        never makes a second one. ``on_retry(error, delay)`` is told of each retry.
        """
        try:
            manifest_bytes = manifest.read_bytes()
        except OSError as exc:
            raise BadRequest(
                f"cannot read manifest {manifest}: {exc.strerror or exc}", code="C101"
            ) from exc
        definition = model_definition_bytes(code)
        files = {
            "manifest": (manifest.name, manifest_bytes, "application/x-yaml"),
            "model_definition": (f"{code.stem or 'model'}.zip", definition, "application/zip"),
        }
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        delay = retry_delay
        for attempt in range(retries + 1):
            try:
                return self._json("POST", "/v1/models", files=files, headers=headers)
            except ApiError as error:
                if attempt == retries or not (
                    error.status == 0 or error.status in RETRY_HTTP_STATUSES
                ):
                    raise
                if on_retry is not None:
                    on_retry(error, delay)
                time.sleep(delay)
                delay = min(delay * 2, SUBMIT_RETRY_DELAY_MAX_S)
        raise AssertionError("unreachable")  # the loop returns or raises

    def list_models(
        self,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        after: str | None = None,
    ) -> dict[str, Any]:
        """A page of models, newest first; its ``next`` (absent on the last page) is the
        ``after`` of the page that follows."""
        params: dict[str, str | int] = {"limit": limit}
        if after is not None:
            params["after"] = after
        else:
            params["offset"] = offset
        if status:
            params["status"] = status
        return self._json("GET", "/v1/models", params=params)

    def get_model(self, model_id: str) -> dict[str, Any]:
        return self._json("GET", self._model_path(model_id))

    def _patch(self, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("PATCH", self._model_path(model_id), json=body)

    def halt(self, model_id: str) -> dict[str, Any]:
        return self._patch(model_id, {"status": "halt"})

    def resume(self, model_id: str) -> dict[str, Any]:
        return self._patch(model_id, {"status": "resume"})

    def cancel(self, model_id: str) -> dict[str, Any]:
        """Stop a job for good and keep its record (``delete`` removes it)."""
        return self._patch(model_id, {"status": "cancel"})

    def set_priority(self, model_id: str, priority: int) -> dict[str, Any]:
        return self._patch(model_id, {"priority": priority})

    def scale(
        self, model_id: str, gpus: int | None = None, gpu_type: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"gpus": gpus, "gpu_type": gpu_type}
        return self._patch(model_id, {k: v for k, v in body.items() if v is not None})

    def delete(self, model_id: str) -> dict[str, Any]:
        return self._json("DELETE", self._model_path(model_id))

    def nodes(self) -> dict[str, Any]:
        return self._json("GET", "/v1/nodes")

    def drain(self, node: str, reason: str = "maintenance") -> dict[str, Any]:
        path = f"/v1/nodes/{quote(node, safe='')}/drain"
        return self._json("POST", path, json={"reason": reason})

    def undrain(self, node: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/nodes/{quote(node, safe='')}/undrain")

    def queue(self) -> dict[str, Any]:
        return self._json("GET", "/v1/queue")

    def replicas(self) -> dict[str, Any]:
        return self._json("GET", "/v1/replicas")

    def tenants(self) -> dict[str, Any]:
        return self._json("GET", "/v1/tenants")

    def create_tenant(
        self, tenant_id: str, *, max_gpus: int | None = None, max_running_jobs: int | None = None
    ) -> dict[str, Any]:
        body = {"id": tenant_id, "max_gpus": max_gpus, "max_running_jobs": max_running_jobs}
        return self._json("POST", "/v1/tenants", json=body)

    def set_quota(
        self, tenant_id: str, *, max_gpus: int | None = None, max_running_jobs: int | None = None
    ) -> dict[str, Any]:
        body = {"max_gpus": max_gpus, "max_running_jobs": max_running_jobs}
        return self._json("PATCH", f"/v1/tenants/{quote(tenant_id, safe='')}", json=body)

    def create_user(self, tenant_id: str, name: str, *, role: str = "member") -> dict[str, Any]:
        path = f"/v1/tenants/{quote(tenant_id, safe='')}/users"
        return self._json("POST", path, json={"name": name, "role": role})

    def users(self, tenant: str | None = None) -> dict[str, Any]:
        """Users the caller administers, with their role and whether they have a password."""
        return self._json("GET", "/v1/users", params={"tenant": tenant} if tenant else {})

    def set_password(
        self, user: str, password: str, *, current_password: str | None = None
    ) -> dict[str, Any]:
        """Set ``user``'s HTTP Basic password; your own needs ``current_password`` if set."""
        body = {"password": password, "current_password": current_password}
        return self._json("PUT", f"/v1/users/{quote(user, safe='')}/password", json=body)

    def remove_password(self, user: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/users/{quote(user, safe='')}/password")

    def tokens(self, user: str | None = None) -> dict[str, Any]:
        """The tokens the caller manages (its own; an admin's also its users')."""
        params = {"user": user} if user else {}
        return self._json("GET", "/v1/tokens", params=params)

    def create_token(self, name: str = "", ttl_days: float | None = None) -> dict[str, Any]:
        """A new token for the caller; its secret is in the answer's ``token``, only there."""
        body: dict[str, Any] = {"name": name}
        if ttl_days is not None:
            body["ttl_days"] = ttl_days
        return self._json("POST", "/v1/tokens", json=body)

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/tokens/{quote(token_id, safe='')}")

    def audit(
        self, pagesize: int = 100, offset: int = 0, action: str | None = None
    ) -> dict[str, Any]:
        params: dict[str, str | int] = {"pagesize": pagesize, "offset": offset}
        if action:
            params["action"] = action
        return self._json("GET", "/v1/audit", params=params)

    def download_definition(self, model_id: str, dest: Path) -> Path:
        return self._download(self._model_path(model_id, "/definition"), dest)

    def download_trained_model(self, model_id: str, dest: Path) -> Path:
        return self._download(self._model_path(model_id, "/trained_model"), dest)

    def _download(self, path: str, dest: Path) -> Path:
        """Stream ``path`` into ``dest``; a failed download leaves no partial file behind."""
        partial = dest.with_name(dest.name + ".part")
        try:
            with self._http.stream("GET", path, headers={"Accept": "*/*"}) as response:
                if response.is_error:
                    response.read()
                    raise error_from_response(response)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise self._transport_error(exc) from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(dest)
        return dest

    @staticmethod
    def _log_params(
        since_time: str | int | None, pagesize: int | None, pos: int | None
    ) -> dict[str, str | int]:
        params: dict[str, str | int] = {}
        if since_time is not None:
            params["since_time"] = since_time
        if pagesize is not None:
            params["pagesize"] = pagesize
        if pos is not None:
            params["pos"] = pos
        return params

    def loglines(
        self,
        model_id: str,
        since_time: str | int | None = None,
        pagesize: int | None = None,
        pos: int | None = None,
    ) -> list[dict[str, Any]]:
        """Log lines of a job; ``pos`` < 0 counts from the end."""
        path = f"/v1/logs/{quote(model_id, safe='')}/loglines"
        body = self._json("GET", path, params=self._log_params(since_time, pagesize, pos))
        return _page_items(body, "lines")

    def emetrics(
        self,
        model_id: str,
        since_time: str | int | None = None,
        pagesize: int | None = None,
        pos: int | None = None,
    ) -> list[dict[str, Any]]:
        """Evaluation-metric records of a job; ``pos`` < 0 counts from the end."""
        path = f"/v1/logs/{quote(model_id, safe='')}/emetrics"
        body = self._json("GET", path, params=self._log_params(since_time, pagesize, pos))
        return _page_items(body, "records")

    def follow(
        self,
        model_id: str,
        since_rindex: int = 0,
        *,
        reconnect_window: float = 60.0,
        retry_delay: float = 0.5,
        read_timeout: float = 60.0,
        deadline: float | None = None,
    ) -> Iterator[FollowEvent]:
        """The job's events until its ``end`` event, reconnecting when the stream drops.

        A reconnect asks for lines from the last ``rindex`` seen and drops lines already
        delivered, so no line is lost or repeated whether the server's bound is inclusive or
        not. Gives up with ``ApiError`` when no stream could be re-established (or no keep-alive
        arrived) for ``reconnect_window`` seconds (while the platform answers 503, its
        database away, for ``unavailable_wait_s``), or after ``deadline`` seconds in all.
        """
        path = self._model_path(model_id, "/events/stream")
        timeout = httpx.Timeout(self.timeout, read=read_timeout)
        started = time.monotonic()
        give_up_at = started + reconnect_window
        cursor = since_rindex
        last_rindex: int | None = None
        delay = retry_delay
        problem = "the event stream ended before the job did"
        unavailable_since: float | None = None
        while True:
            try:
                with self._http.stream(
                    "GET",
                    path,
                    params={"since_rindex": cursor},
                    headers={"Accept": "text/event-stream"},
                    timeout=timeout,
                ) as response:
                    if response.status_code == 503:
                        # The platform's database is away: reconnect within the window.
                        response.read()
                        raise _StreamUnavailable(error_from_response(response).message)
                    if response.is_error:
                        response.read()
                        raise error_from_response(response)
                    for message in iter_sse(response.iter_lines()):
                        give_up_at = time.monotonic() + reconnect_window
                        delay = retry_delay
                        self._check_deadline(model_id, started, deadline)
                        if message is None:
                            continue
                        event = FollowEvent(message[0], _event_data(message[1]))
                        if event.kind == "log":
                            rindex = _log_rindex(event.data)
                            if rindex is not None:
                                if last_rindex is not None and rindex <= last_rindex:
                                    continue
                                last_rindex = cursor = rindex
                        yield event
                        if event.kind == "end":
                            return
                problem = "the event stream ended before the job did"
            except httpx.TransportError as exc:
                problem = str(exc) or type(exc).__name__
            except _StreamUnavailable as exc:
                problem = str(exc)
                # The platform is alive and says so: wait as long as for any request.
                unavailable_since = unavailable_since or time.monotonic()
                give_up_at = max(give_up_at, unavailable_since + self.unavailable_wait_s)
            else:
                unavailable_since = None
            now = time.monotonic()
            self._check_deadline(model_id, started, deadline)
            if now >= give_up_at:
                raise ApiError(
                    0, UNREACHABLE, f"lost the event stream of {model_id} at {self.url}: {problem}"
                )
            time.sleep(min(delay, give_up_at - now))
            delay = min(delay * 2, 5.0)

    @staticmethod
    def _check_deadline(model_id: str, started: float, deadline: float | None) -> None:
        if deadline is not None and time.monotonic() - started >= deadline:
            raise ApiError(0, "TIMEOUT", f"{model_id} did not end within {deadline:g} s")
