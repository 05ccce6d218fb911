"""Schemathesis over the whole OpenAPI of a real server, as a member and as a platform admin.

One server serves the module (127.0.0.1, a subprocess). Its platform admin token comes from
HOME/client.json; through the API the fixture creates tenant ``fuzz`` with a member user (the
user token), and, as that member, two jobs that complete: ``done`` (log lines and a trained
model) and ``spare`` (for DELETE). Schemathesis loads the live ``/openapi.json`` and, for every
operation, sends its examples, its coverage cases (including methods the path does not
have, which must answer 405 with ``Allow``) and a few generated cases over real HTTP, each
once with the member's token and once with the admin's. Every answer must pass
``not_a_server_error``, ``status_code_conformance``, ``content_type_conformance``,
``response_headers_conformance``, ``response_schema_conformance``, ``unsupported_method``
and ``ignored_auth`` (an operation behind a token refuses a request without one).

Random ids never name anything, so about half the cases (chosen from the generated value,
hence reproducible) are pointed at real objects: ``model_id`` and ``job_id`` at ``done``
(``spare`` for DELETE of a model, which removes it), ``tenant_id`` at ``fuzz`` and ``name``
at the one node, ``/static/{name}`` at the dashboard's assets.

No operation is excluded. The one whose real effect would wreck the run gets fresh data
instead: DELETE ``/v1/tokens/{token_id}`` revokes, when aimed, a throwaway token that the
caller creates just before (never the run's own tokens: once revoked, every later answer
would be a 401); random token ids match none. Draining ``node-a`` is allowed: nothing needs
scheduling once the jobs above have completed. Multipart submits with generated manifests
are refused (400), as they should be.

Bounded and reproducible: ``MAX_EXAMPLES`` generated cases per operation on top of the
examples and coverage cases, derandomized with a fixed seed and no example database, so
each run sends the same cases: under a minute on two cores, with a hard limit of
``BUDGET_S``. The coverage cases already walk every parameter's edges; each further
generated case per operation adds about 3.5 s to the run and seldom a new shape of request.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case
from schemathesis.checks import load_all_checks, not_a_server_error
from schemathesis.core.result import Err
from schemathesis.pytest.lazy import get_all_tests
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    code_zip,
    manifest_yaml,
    serving,
    wait_for,
)

MAX_EXAMPLES = 4
SEED = 20261123
BUDGET_S = 300
REQUEST_TIMEOUT_S = 10.0
TENANT = "fuzz"
NODE = "node-a"
ASSETS = ("index.html", "app.js", "style.css")

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    unsupported_method,
    ignored_auth,
]

# A learner's results upload is a zip: sent as any binary body is.
schemathesis.serializer.alias("application/zip", "application/octet-stream")

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "request-timeout": REQUEST_TIMEOUT_S,
        "suppress-health-check": ["all"],
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
        },
        "phases": {"stateful": {"enabled": False}},
    }
)
SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

WRITE_RESULT = """
import os
for i in range(3):
    print(f"line {i}")
with open(os.path.join(os.environ["RESULT_DIR"], "model.txt"), "w") as out:
    out.write("weights")
"""


@dataclass
class Fuzzed:
    server: LiveServer
    user_token: str
    done: str
    spare: str

    def tokens(self) -> dict[str, str]:
        return {"member": self.user_token, "admin": self.server.token}


def _submit(client: httpx.Client, name: str) -> str:
    response = client.post(
        "/v1/models",
        files={
            "manifest": ("m.yml", manifest_yaml("python w.py", name=name).encode()),
            "model_definition": ("m.zip", code_zip({"w.py": WRITE_RESULT}), "application/zip"),
        },
    )
    assert response.status_code == 201, response.text
    return str(response.json()["model_id"])


def _completed(client: httpx.Client, job_id: str) -> bool:
    training = client.get(f"/v1/models/{job_id}").json()["training"]
    status = training["training_status"]["status"]
    assert status not in ("FAILED", "CANCELLED"), training
    return bool(status == "COMPLETED")


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    home: Path = tmp_path_factory.mktemp("openapi") / "home"
    # Webhook URLs the fuzzer makes up may only lead to loopback, never out of this host.
    config = {**FAST_CONFIG, "webhook_allowed_hosts": ["127.0.0.1"]}
    with serving(LiveServer(home=home, config=config)) as server:
        admin = server.client
        assert admin.post("/v1/tenants", json={"id": TENANT}).status_code == 201
        created = admin.post(f"/v1/tenants/{TENANT}/users", json={"name": "member"})
        assert created.status_code == 201, created.text
        user_token = str(created.json()["token"])
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {user_token}"}, timeout=30
        ) as member:
            done, spare = _submit(member, "done"), _submit(member, "spare")
            for job in (done, spare):
                wait_for(lambda job=job: _completed(member, job), timeout=60, what=job)
        yield Fuzzed(server=server, user_token=user_token, done=done, spare=spare)


def _pick(value: Any) -> int | None:
    """Which real object to point this generated value at, or ``None`` for about half of
    them; decided by the value itself, so the run stays reproducible."""
    digest = zlib.crc32(repr(value).encode())
    return digest // 2 if digest % 2 == 0 else None


def _fresh_token(fuzzed: Fuzzed, token: str) -> str:
    response = httpx.post(
        f"{fuzzed.server.url}/v1/tokens",
        json={"name": "throwaway"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _aim(case: Case, fuzzed: Fuzzed) -> bool:
    """Point ``case``'s path parameters at real objects, for about half of the cases (see the
    module's docstring); whether it did."""
    params: dict[str, Any] | None = case.path_parameters
    pick = _pick(params) if params else None
    if params is None or pick is None:
        return False
    method, path = case.operation.method.upper(), case.operation.path
    known = {
        "model_id": fuzzed.spare if method == "DELETE" else fuzzed.done,
        "job_id": fuzzed.done,
        "tenant_id": TENANT,
        "name": NODE if path.startswith("/v1/nodes/") else ASSETS[pick % len(ASSETS)],
    }
    for key in params:
        if key in known:
            params[key] = known[key]
    return True


def _exercise(case: Case, fuzzed: Fuzzed) -> None:
    """One generated case, sent once with each token; every answer must pass ``CHECKS``."""
    aimed = _aim(case, fuzzed)
    for token in fuzzed.tokens().values():
        if aimed and case.path_parameters and "token_id" in case.path_parameters:
            case.path_parameters["token_id"] = _fresh_token(fuzzed, token)
        case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"},
            checks=CHECKS,
            timeout=REQUEST_TIMEOUT_S,
        )


@pytest.mark.timeout(BUDGET_S)
def test_every_answer_is_documented(fuzzed: Fuzzed) -> None:
    api = schemathesis.openapi.from_url(f"{fuzzed.server.url}/openapi.json", config=CONFIG)
    load_all_checks()
    failures: dict[str, str] = {}
    tested = []

    def exercise(case: Case) -> None:
        _exercise(case, fuzzed)

    # Each operation's Hypothesis test (examples, coverage cases, then generated cases) as
    # schemathesis's pytest integration builds them, run one after the other here: that
    # integration's fixture-based loader fails under pytest 9.2 (``Node._nodeid`` is gone).
    for result in get_all_tests(schema=api, test_func=exercise, settings=SETTINGS, given_kwargs={}):
        if isinstance(result, Err):
            failures[str(result.err())] = "the OpenAPI document is invalid here"
            continue
        operation, run = result.ok()
        tested.append(operation.label)
        try:
            run()
        # Every operation runs; all failures are reported at the end. Schemathesis raises its
        # check failures as a BaseExceptionGroup.
        except (Exception, BaseExceptionGroup) as exc:
            failures[operation.label] = f"{type(exc).__name__}: {exc}"
    assert len(tested) >= 25, tested
    assert not failures, "\n\n".join(f"{label}\n{text}" for label, text in failures.items())


def _openapi(fuzzed: Fuzzed) -> dict[str, Any]:
    document: dict[str, Any] = httpx.get(f"{fuzzed.server.url}/openapi.json", timeout=30).json()
    return document


def test_a_method_the_path_lacks_is_405_allowing_every_method_it_has(fuzzed: Fuzzed) -> None:
    auth = {"Authorization": f"Bearer {fuzzed.server.token}"}
    cases = [
        ("PUT", "/v1/models", "GET, POST"),
        ("POST", f"/v1/models/{fuzzed.done}", "GET, PATCH, DELETE"),
        ("DELETE", "/health", "GET"),
        ("GET", f"/v1/nodes/{NODE}/drain", "POST"),
        ("PUT", "/v1/tokens/tok-0", "DELETE"),
    ]
    for method, path, allowed in cases:
        response = httpx.request(method, f"{fuzzed.server.url}{path}", headers=auth, timeout=30)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["allow"] == allowed, (method, path)
        assert response.json() == {
            "code": 405,
            "error": "Method Not Allowed",
            "description": "Method Not Allowed",
            "ffdl_code": "H405",
            "detail": None,
        }


def test_the_openapi_documents_the_error_body_and_never_a_422(fuzzed: Fuzzed) -> None:
    document = _openapi(fuzzed)
    required = set(document["components"]["schemas"]["ErrorBody"]["required"])
    assert required == {"code", "error", "description", "ffdl_code"}
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            where = f"{method.upper()} {path}"
            responses = operation["responses"]
            assert "422" not in responses, where
            for status, response in responses.items():
                if status.startswith("4"):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, where
            # Outside /v1 only Prometheus's /metrics needs a token.
            if not path.startswith("/v1/") and path != "/metrics":
                assert "security" not in operation, where
                continue
            # A user's route takes a token or HTTP Basic; a controller's, its job token.
            schemes = (
                [{"JobToken": []}]
                if path.startswith("/v1/internal/")
                else [{"ApiToken": []}, {"BasicAuth": []}]
            )
            assert operation["security"] == schemes, where
            assert "401" in responses, where
            queried = any(param["in"] == "query" for param in operation.get("parameters", []))
            if queried or "requestBody" in operation:
                assert "400" in responses, where
    assert "413" in document["paths"]["/v1/models"]["post"]["responses"]


def test_streams_downloads_and_the_dashboard_have_their_media_types(fuzzed: Fuzzed) -> None:
    paths = _openapi(fuzzed)["paths"]

    def media(path: str) -> set[str]:
        return set(paths[path]["get"]["responses"]["200"]["content"])

    assert media("/v1/models/{model_id}/events/stream") == {"text/event-stream"}
    assert media("/v1/models/{model_id}/definition") == {"application/octet-stream"}
    assert media("/v1/models/{model_id}/trained_model") == {"application/octet-stream"}
    assert media("/v1/models/{model_id}/logs") == {"application/octet-stream"}
    assert media("/v1/models/{model_id}/metrics") == {"application/octet-stream"}
    assert media("/") == {"text/html"}
    assert media("/static/{name}") >= {"text/html", "text/javascript", "text/css"}
    created = paths["/v1/models"]["post"]["responses"]["201"]
    assert created["headers"]["Location"]["required"] is True
