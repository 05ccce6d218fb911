"""Roles and tenant scoping on a real server: every endpoint, as a member, a tenant admin and a
platform admin, against the jobs, tokens and tenant of another tenant.

One server serves the whole module. Tenant A (``team-a``) has a member and a tenant admin;
tenant B (``team-b``) has a member whose jobs and token are the targets. The platform admin is
the bootstrap user. Only the platform admin's requests change anything, and those target
objects no other test relies on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    code_zip,
    manifest_yaml,
    serving,
    wait_for,
)

MEMBER, TENANT_ADMIN, PLATFORM_ADMIN = "member", "tenant-admin", "platform-admin"
ROLES = (MEMBER, TENANT_ADMIN, PLATFORM_ADMIN)

CONFIG: dict[str, Any] = {
    **FAST_CONFIG,
    # Webhooks registered by the matrix point at a closed port on loopback.
    "webhook_allowed_hosts": ["127.0.0.1"],
    # node-spare takes no GPU job, so draining it in the matrix disturbs nothing.
    "nodes": [
        {"name": "node-a", "gpus": 4, "cpus": 16, "memory": "32GiB", "gpu_type": "cpu"},
        {"name": "node-spare", "gpus": 0, "cpus": 1, "memory": "1GiB", "gpu_type": "cpu"},
    ],
}
WRITE_RESULT = (
    "import os, pathlib\n"
    "print('tenant b was here')\n"
    "pathlib.Path(os.environ['RESULT_DIR'], 'weights.bin').write_bytes(b'w')\n"
)
SLEEP = "import time\nprint('holding a gpu', flush=True)\ntime.sleep(600)\n"


@dataclass
class World:
    server: LiveServer
    clients: dict[str, httpx.Client] = field(default_factory=dict)
    bob: httpx.Client | None = None
    b_done: str = ""  # tenant B, COMPLETED with a trained model
    b_live: str = ""  # tenant B, PROCESSING (holds a GPU on node-a)
    b_spare: str = ""  # tenant B, COMPLETED; the platform admin deletes it
    b_token: str = ""  # id of a token of tenant B's member
    a_job: str = ""  # tenant A, COMPLETED

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    @property
    def b(self) -> httpx.Client:
        assert self.bob is not None
        return self.bob


def submit(client: httpx.Client, manifest: str, files: dict[str, str]) -> str:
    response = client.post(
        "/v1/models",
        files={
            "manifest": ("manifest.yml", manifest.encode()),
            "model_definition": ("code.zip", code_zip(files)),
        },
    )
    assert response.status_code == 201, response.text
    return str(response.json()["model_id"])


def status_of(client: httpx.Client, job_id: str) -> str:
    return str(client.get(f"/v1/models/{job_id}").json()["training"]["training_status"]["status"])


def wait_status(client: httpx.Client, job_id: str, wanted: set[str]) -> None:
    wait_for(lambda: status_of(client, job_id) in wanted, timeout=60, what=f"{job_id} {wanted}")


def add_user(admin: httpx.Client, tenant: str, name: str, role: str = "member") -> dict[str, Any]:
    response = admin.post(f"/v1/tenants/{tenant}/users", json={"name": name, "role": role})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("roles") / "home"
    with serving(LiveServer(home=home, config=CONFIG)) as server:
        world = World(server=server)
        admin = server.client
        for tenant in ("team-a", "team-b"):
            assert admin.post("/v1/tenants", json={"id": tenant}).status_code == 201
        world.clients[PLATFORM_ADMIN] = admin
        world.clients[MEMBER] = world.client(add_user(admin, "team-a", "mia")["token"])
        world.clients[TENANT_ADMIN] = world.client(
            add_user(admin, "team-a", "ada", "admin")["token"]
        )
        world.bob = world.client(add_user(admin, "team-b", "bob")["token"])
        done = manifest_yaml("python w.py", name="b-done")
        world.b_done = submit(world.b, done, {"w.py": WRITE_RESULT})
        world.b_spare = submit(world.b, manifest_yaml("true", name="b-spare"), {"x": ""})
        world.b_live = submit(world.b, manifest_yaml("python s.py", name="b-live"), {"s.py": SLEEP})
        world.a_job = submit(world.clients[MEMBER], manifest_yaml("true", name="a-job"), {"x": ""})
        created = world.b.post("/v1/tokens", json={"name": "bob's laptop"})
        assert created.status_code == 201, created.text
        world.b_token = created.json()["id"]
        for job in (world.b_done, world.b_spare):
            wait_status(world.b, job, {"COMPLETED"})
        wait_status(world.b, world.b_live, {"PROCESSING"})
        wait_status(world.clients[MEMBER], world.a_job, {"COMPLETED"})
        try:
            yield world
        finally:
            for client in [*world.clients.values(), world.b]:
                if client is not admin:
                    client.close()


# -- the matrix ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    method: str
    path: str  # as the OpenAPI document writes it
    expect: tuple[int, int, int]  # member, tenant admin, platform admin
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    target: str = "b_done"  # which World job fills {model_id} / {job_id}


EVENT_ENDPOINT = "/v1/models/{model_id}/events/{event_type}/{endpoint_id}"


def job_ops() -> list[Op]:
    mine = (201, 201, 201)
    hidden = (404, 404, 200)
    return [
        Op("GET", "/health", (200, 200, 200)),
        # Every role scrapes; a member's answer holds only its tenant's series.
        Op("GET", "/metrics", (200, 200, 200)),
        # The public dashboard: the same for everyone (no asset is called {name} here).
        Op("GET", "/", (200, 200, 200)),
        Op("GET", "/static/{name}", (404, 404, 404)),
        Op("POST", "/v1/models", mine),
        Op("GET", "/v1/models", (200, 200, 200)),
        Op("GET", "/v1/models/{model_id}", hidden),
        Op("GET", "/v1/models/{model_id}/gpu", hidden),
        Op("PATCH", "/v1/models/{model_id}", (404, 404, 202), {"priority": 60}, target="b_live"),
        Op("DELETE", "/v1/models/{model_id}", hidden, target="b_spare"),
        Op("GET", "/v1/models/{model_id}/definition", hidden),
        Op("GET", "/v1/models/{model_id}/trained_model", hidden),
        Op("GET", "/v1/models/{model_id}/events/stream", hidden),
        Op("GET", "/v1/models/{model_id}/logs", hidden),
        Op("GET", "/v1/models/{model_id}/metrics", hidden),
        Op("GET", "/v1/logs/{model_id}/loglines", hidden),
        Op("GET", "/v1/logs/{model_id}/emetrics", hidden),
        Op("POST", EVENT_ENDPOINT, hidden, {"url": "http://127.0.0.1:9/hook"}, target="b_live"),
        Op("GET", "/v1/models/{model_id}/events/{event_type}", hidden, target="b_live"),
        Op("GET", EVENT_ENDPOINT, (404, 404, 200), target="b_live"),
        Op("DELETE", EVENT_ENDPOINT, (404, 404, 200), target="b_live"),
    ]


def admin_ops() -> list[Op]:
    platform_only = (403, 403, 200)
    return [
        Op("GET", "/v1/nodes", (200, 200, 200)),
        Op("GET", "/v1/queue", (200, 200, 200)),
        Op("GET", "/v1/cluster/history", (200, 200, 200)),
        Op("GET", "/v1/replicas", platform_only),
        Op("GET", "/v1/cluster/pool", platform_only),
        Op("POST", "/v1/nodes/{name}/drain", platform_only, {"reason": "matrix"}),
        Op("POST", "/v1/nodes/{name}/undrain", platform_only),
        Op("GET", "/v1/tenants", (403, 200, 200)),
        Op("POST", "/v1/tenants", (403, 403, 201), {"id": "team-c"}),
        Op("PATCH", "/v1/tenants/{tenant_id}", platform_only, {"max_gpus": 64}),
        Op("POST", "/v1/tenants/{tenant_id}/users", (403, 403, 201), {"name": "newbie"}),
        Op("GET", "/v1/tokens", (200, 200, 200)),
        Op("POST", "/v1/tokens", (201, 201, 201), {"name": "matrix"}),
        Op("DELETE", "/v1/tokens/{token_id}", (404, 404, 200)),
        Op("GET", "/v1/users", (403, 200, 200)),
        Op("PUT", "/v1/users/{user_id}/password", (404, 404, 200), {"password": "matrix pw!"}),
        Op("DELETE", "/v1/users/{user_id}/password", (404, 404, 200)),
        Op("GET", "/v1/audit", (403, 200, 200)),
        Op(
            "POST",
            "/v1/internal/jobs/{job_id}/learners/{learner}/reports",
            (401, 401, 401),
            {"attempt": 1, "items": []},
        ),
        Op("GET", "/v1/internal/jobs/{job_id}/code", (401, 401, 401)),
        Op("PUT", "/v1/internal/jobs/{job_id}/learners/{learner}/results", (401, 401, 401)),
    ]


MATRIX = job_ops() + admin_ops()


def concrete_path(op: Op, world: World) -> str:
    job = str(getattr(world, op.target))
    values = {
        "model_id": job,
        "job_id": job,
        "learner": "1",
        "name": "node-spare",
        "tenant_id": "team-b",
        "token_id": world.b_token,
        "user_id": "team-b.bob",
        "event_type": "update",
        "endpoint_id": "matrix",
    }
    return op.path.format(**values)


def send(world: World, role: str, op: Op) -> httpx.Response:
    client = world.clients[role]
    path = concrete_path(op, world)
    if (op.method, op.path) == ("POST", "/v1/models"):
        manifest = manifest_yaml("true", name=f"matrix-{role}")
        return client.post(
            path,
            files={
                "manifest": ("m.yml", manifest.encode()),
                "model_definition": ("c.zip", code_zip({"x": ""})),
            },
        )
    return client.request(op.method, path, json=op.json, params=op.params)


def test_the_matrix_covers_every_endpoint_of_the_api(world: World) -> None:
    schema = world.server.client.get("/openapi.json").json()
    served = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    listed = {(op.method, op.path) for op in MATRIX}
    assert served - listed == set(), "endpoints missing from the role matrix"
    assert listed - served == set(), "the matrix lists endpoints the API no longer has"


@pytest.mark.parametrize("role", ROLES)
def test_each_role_gets_what_it_may_on_another_tenants_resources(world: World, role: str) -> None:
    failures = []
    for op in MATRIX:
        expected = op.expect[ROLES.index(role)]
        response = send(world, role, op)
        if response.status_code != expected:
            failures.append(f"{op.method} {op.path}: {response.status_code} {response.text[:200]}")
        elif expected == 404:
            # The same answer as for a job that never existed: nothing leaks.
            assert response.json()["ffdl_code"] == "C404", response.text
        elif expected in (401, 403):
            assert set(response.json()) == {"code", "error", "description", "ffdl_code", "detail"}
    assert failures == [], f"{role} expected {[op.expect for op in MATRIX]}"


# -- what each role sees ------------------------------------------------------------------


def test_lists_show_only_the_callers_tenant(world: World) -> None:
    b_jobs = {world.b_done, world.b_live}
    for role in (MEMBER, TENANT_ADMIN):
        client = world.clients[role]
        ids = {m["model_id"] for m in client.get("/v1/models").json()["models"]}
        assert world.a_job in ids and not ids & b_jobs, (role, ids)
        queue = client.get("/v1/queue").json()["queue"]
        assert all(entry["tenant"] == "team-a" for entry in queue)
        users = {t["user"] for t in client.get("/v1/tokens").json()["tokens"]}
        assert "team-b.bob" not in users
    every = world.clients[PLATFORM_ADMIN].get("/v1/models", params={"limit": 1000}).json()
    assert b_jobs <= {m["model_id"] for m in every["models"]}
    member_tokens = world.clients[MEMBER].get("/v1/tokens").json()["tokens"]
    assert {t["user"] for t in member_tokens} == {"team-a.mia"}
    assert all("token" not in t and "token_hash" not in t for t in member_tokens)
    admin_tokens = world.clients[TENANT_ADMIN].get("/v1/tokens").json()["tokens"]
    assert {"team-a.mia", "team-a.ada"} <= {t["user"] for t in admin_tokens}
    assert "admin" not in {t["user"] for t in admin_tokens}
    tenants = world.clients[TENANT_ADMIN].get("/v1/tenants").json()["tenants"]
    assert [t["id"] for t in tenants] == ["team-a"]
    everyone = world.clients[PLATFORM_ADMIN].get("/v1/tenants").json()["tenants"]
    assert {"default", "team-a", "team-b"} <= {t["id"] for t in everyone}


def test_nodes_show_other_tenants_allocations_only_as_in_use(world: World) -> None:
    def holders(client: httpx.Client) -> list[dict[str, Any]]:
        response = client.get("/v1/nodes")
        assert response.status_code == 200
        nodes = {n["name"]: n for n in response.json()["nodes"]}
        found: list[dict[str, Any]] = nodes["node-a"]["holders"]
        return found

    admin_view = holders(world.clients[PLATFORM_ADMIN])
    b_gpus = next(h["gpu_ids"] for h in admin_view if h["model_id"] == world.b_live)
    for role in (MEMBER, TENANT_ADMIN):
        client = world.clients[role]
        assert world.b_live not in client.get("/v1/nodes").text
        seen = holders(client)
        # Jobs of other tests may run too: whatever is named is team-a's, the rest is anonymous.
        assert all(h["tenant"] == "team-a" for h in seen if h["model_id"] is not None), seen
        redacted = [h for h in seen if h["model_id"] is None]
        assert all(h["status"] == "in use" and h["tenant"] is None for h in redacted)
        assert all(h["learner"] is None for h in redacted)
        assert b_gpus in [h["gpu_ids"] for h in redacted], seen
    own = [h for h in holders(world.b) if h["model_id"] == world.b_live]
    assert own and own[0]["tenant"] == "team-b" and own[0]["status"] == "PROCESSING"


def test_tenant_admin_manages_only_its_own_tenant(world: World) -> None:
    ada = world.clients[TENANT_ADMIN]

    def create(tenant: str, name: str, role: str) -> httpx.Response:
        return ada.post(f"/v1/tenants/{tenant}/users", json={"name": name, "role": role})

    member = create("team-a", "tim", "member")
    assert member.status_code == 201, member.text
    assert create("team-a", "tia", "admin").status_code == 201
    assert create("team-a", "pam", "platform-admin").status_code == 403
    assert create("team-b", "eve", "member").status_code == 403
    assert create("default", "eve", "admin").status_code == 403
    assert ada.patch("/v1/tenants/team-a", json={"max_gpus": 100}).status_code == 403
    assert ada.post("/v1/tenants", json={"id": "team-z"}).status_code == 403
    # Its own tenant's jobs are its to see.
    assert ada.get(f"/v1/models/{world.a_job}").status_code == 200
    # It sees and revokes its users' tokens; the revoked token is refused at once.
    tim = world.client(member.json()["token"])
    assert tim.get("/v1/models").status_code == 200
    tim_tokens = ada.get("/v1/tokens", params={"user": "team-a.tim"}).json()["tokens"]
    assert [t["id"] for t in tim_tokens] == [member.json()["token_id"]]
    assert ada.delete(f"/v1/tokens/{tim_tokens[0]['id']}").status_code == 200
    refused = tim.get("/v1/models")
    assert refused.status_code == 401 and refused.json()["ffdl_code"] == "C103"
    tim.close()
    # The platform admin's tokens are out of its reach even in its own tenant's terms.
    admin_tokens = world.clients[PLATFORM_ADMIN].get("/v1/tokens", params={"user": "admin"})
    for token in admin_tokens.json()["tokens"]:
        assert ada.delete(f"/v1/tokens/{token['id']}").status_code == 404


def test_a_member_may_not_create_users(world: World) -> None:
    mia = world.clients[MEMBER]
    response = mia.post("/v1/tenants/team-a/users", json={"name": "sneaky"})
    assert response.status_code == 403
    assert mia.get("/v1/audit").status_code == 403


def test_out_of_range_quotas_and_long_names_are_400s_naming_the_field(world: World) -> None:
    admin = world.clients[PLATFORM_ADMIN]
    for field_name in ("max_gpus", "max_running_jobs"):
        for value in (2**63, 2**64 + 1, 1_000_001, -2, True, False, "3"):
            response = admin.patch("/v1/tenants/team-b", json={field_name: value})
            assert response.status_code == 400, (field_name, value, response.text)
            assert response.json()["detail"][0]["field"] == field_name
        created = admin.post("/v1/tenants", json={"id": "team-big", field_name: 2**63})
        assert created.status_code == 400 and field_name in created.json()["description"]
    long_name = admin.post("/v1/tenants", json={"id": "team-long", "name": "x" * 201})
    assert long_name.status_code == 400
    assert long_name.json()["detail"][0]["field"] == "name"
    reason = admin.post("/v1/nodes/node-spare/drain", json={"reason": "r" * 201})
    assert reason.status_code == 400 and reason.json()["detail"][0]["field"] == "reason"
    assert admin.get("/v1/tenants").status_code == 200
    assert "team-big" not in admin.get("/v1/tenants").text


def test_admin_actions_are_audited_and_each_admin_sees_its_share(world: World) -> None:
    admin = world.clients[PLATFORM_ADMIN]
    assert admin.patch("/v1/tenants/team-b", json={"max_running_jobs": 7}).status_code == 200
    assert admin.post("/v1/nodes/node-spare/drain", json={"reason": "audit"}).status_code == 200
    assert admin.post("/v1/nodes/node-spare/undrain").status_code == 200
    assert admin.patch(f"/v1/models/{world.b_live}", json={"priority": 55}).status_code == 202

    events = admin.get("/v1/audit", params={"pagesize": 1000}).json()["events"]
    seen = {(e["action"], e["target"]) for e in events}
    expected = {
        ("tenant.create", "team-a"),
        ("tenant.create", "team-b"),
        ("user.create", "team-a.mia"),
        ("user.create", "team-b.bob"),
        ("token.create", world.b_token),
        ("tenant.quota", "team-b"),
        ("node.drain", "node-spare"),
        ("node.undrain", "node-spare"),
        ("job.priority", world.b_live),
    }
    assert expected <= seen, expected - seen
    quota = next(e for e in events if e["action"] == "tenant.quota")
    assert quota["actor"] == "admin" and "max_running_jobs=7" in quota["detail"]
    assert quota["time"] and quota["tenant"] == "team-b"
    assert events == sorted(events, key=lambda e: -int(e["id"]))

    share = world.clients[TENANT_ADMIN].get("/v1/audit", params={"pagesize": 1000}).json()
    targets = {(e["action"], e["target"]) for e in share["events"]}
    assert ("user.create", "team-a.mia") in targets
    assert not {("user.create", "team-b.bob"), ("node.drain", "node-spare")} & targets
    assert all("team-a" in (e["tenant"], e["actor_tenant"]) for e in share["events"])
    only = admin.get("/v1/audit", params={"action": "node.drain"}).json()["events"]
    assert only and {e["action"] for e in only} == {"node.drain"}
    for bad in (0, 1001, 2**63):
        response = admin.get("/v1/audit", params={"pagesize": bad})
        assert response.status_code == 400, response.text
        assert response.json()["detail"][0]["field"] == "pagesize"
