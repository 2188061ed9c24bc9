"""Address-scoped tokens end to end: a live server in database auth mode, real Terraform, ``kl apply -f``.

One shared state holds a payments module (for_each), a search resource (count, a map with lists, nulls and
unicode), a shared resource and outputs. The payments and search tokens each write their own part of it,
in parallel; each is refused, before Terraform applies, the moment its file reaches outside its scopes;
and a plan-only token plans but cannot apply or take Terraform's lock."""

from __future__ import annotations

import json
import shutil

import pytest
import requests

from app.config import AuthMode
from tests.conftest import Workdir

pytestmark = pytest.mark.terraform

CONTROL = "ctl-scopes"
CTL = {"Authorization": f"Bearer {CONTROL}"}

FILES = {
    "variables.tf": 'variable "env" {\n  type    = string\n  default = "prod"\n}\n',
    "payments.tf": 'module "payments" {\n  source   = "./modules/svc"\n  for_each = toset(["eu", "us"])\n'
                   '  label    = "pay-v1-${each.key}"\n}\n\n'
                   'output "payments_url" {\n  value = module.payments["eu"].id\n}\n',
    "search.tf": 'resource "terraform_data" "search" {\n  count = 2\n'
                 '  input = {\n    name = "search-${count.index}"\n    tags = ["a", "b"]\n'
                 '    none = null\n    label = "recherche-v1 \\u00e9"\n  }\n}\n\n'
                 'output "search_ids" {\n  value = terraform_data.search[*].id\n}\n',
    "shared.tf": 'resource "terraform_data" "shared" {\n  input = "shared-v1-${var.env}"\n}\n',
    "modules/svc/main.tf": 'variable "label" {\n  type = string\n}\n\n'
                           'resource "terraform_data" "svc" {\n  input = var.label\n}\n\n'
                           'output "id" {\n  value = terraform_data.svc.id\n}\n',
}


PAYMENTS_US_ID = 'output "payments_us_id" {\n  value = module.payments["us"].id\n}\n'


def make_token(url: str, name: str, scopes: list[str] | None = None, *, plan_only: bool = False) -> dict:  # type: ignore[type-arg]
    body: dict[str, object] = {"name": name, "environment": "production"}
    if scopes is not None:
        body["scopes"] = scopes
    if plan_only:
        body["plan_only"] = True
    created = requests.post(f"{url}/v1/api/tenants/acme/tokens", json=body, headers=CTL, timeout=10)
    assert created.status_code == 201, created.text
    return created.json()  # type: ignore[no-any-return]


def checkout(source: Workdir, name: str, token: dict) -> Workdir:  # type: ignore[type-arg]
    dest = source.dir.parent / name
    shutil.copytree(source.dir, dest, ignore=shutil.ignore_patterns(".terraform", "*.igplan", "terraform.tfstate*"))
    return Workdir(dest, source.url, {**source.env, "KL_TOKEN": token["token_secret"],
                                      "TF_HTTP_PASSWORD": token["token_secret"]})


@pytest.fixture
def world(live_server_factory, workdir_factory):  # type: ignore[no-untyped-def]
    server = live_server_factory(auth_mode=AuthMode.DATABASE, control_token=CONTROL)
    assert requests.post(f"{server.url}/v1/api/tenants", json={"slug": "acme"}, headers=CTL, timeout=10).ok
    admin = make_token(server.url, "admin")
    block = admin["backend_block"].replace("http://localhost:8080", server.url).replace(
        "http://localhost", server.url)
    repo = workdir_factory("repo", server.url)
    repo.env = {**repo.env, "TF_HTTP_PASSWORD": admin["token_secret"], "KL_TOKEN": admin["token_secret"]}
    repo.write("backend.tf", block)
    for name, text in FILES.items():
        repo.write(name, text)
    repo.tf("init", "-input=false")
    repo.tf("apply", "-auto-approve", "-input=false")
    repo.write(".gitignore", ".terraform/\n*.igplan\nkl-plan.json\n.terraform.lock.hcl\n")
    repo.git("init", "-q")
    repo.git("add", "-A")
    repo.git("commit", "-qm", "trunk")
    state = f"{server.url}/v1/engine/states/{admin['workspace_id']}/{admin['environment_id']}/prod"
    return server, repo, admin, state


def bearer(token: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {"Authorization": f"Bearer {token['token_secret']}"}


def head(state: str, admin: dict) -> dict:  # type: ignore[type-arg]
    listing = requests.get(f"{state}/resources", params={"instance": "1"}, headers=bearer(admin), timeout=10).json()
    return {r["address"]: r for r in listing["resources"]} | {"": listing["serial"]}


def test_two_scoped_tokens_apply_their_own_parts_in_parallel_and_are_refused_outside(world):  # type: ignore[no-untyped-def]
    server, repo, admin, state = world
    payments = make_token(server.url, "payments", ["module.payments.*:write", "output.payments_*:write", "*:read"])
    search = make_token(server.url, "search", ["terraform_data.search.*:write", "output.search_ids:write",
                                                "terraform_data.shared:read"])
    assert payments["token"]["scopes"] == ["*:read", "module.payments.*:write", "output.payments_*:write"]
    pay, srch = checkout(repo, "pay", payments), checkout(repo, "srch", search)
    pay.edit("payments.tf", "pay-v1", "pay-v2")
    pay.write("payments.tf", (pay.dir / "payments.tf").read_text() + PAYMENTS_US_ID)  # inside output.payments_*
    srch.edit("search.tf", "recherche-v1", "recherche-v2")
    before = head(state, admin)

    # Both at once: disjoint scopes, disjoint reservations, one shared state.
    running = [pay.kl_popen("apply", "-f", "payments.tf", "--confirm-scope", "--actor", "pay"),
               srch.kl_popen("apply", "-f", "search.tf", "--confirm-scope", "--actor", "search")]
    outputs = [p.communicate(timeout=300)[0] for p in running]
    assert [p.returncode for p in running] == [0, 0], outputs
    after = head(state, admin)
    assert after[""] == before[""] + 2
    assert after['module.payments["us"].terraform_data.svc']["instance"]["attributes"]["input"]["value"] == "pay-v2-us"
    assert after["terraform_data.search[1]"]["instance"]["attributes"]["input"]["value"]["label"] == "recherche-v2 é"
    assert after["terraform_data.shared"]["create_serial"] == before["terraform_data.shared"]["create_serial"]
    sliced = requests.post(f"{state}/slice", json={"globs": ["*"]}, headers=bearer(admin), timeout=10).json()
    assert sorted(sliced["outputs"]) == ["payments_url", "payments_us_id", "search_ids"]

    # An output of another team's name: refused when the run opens, before Terraform applies anything.
    pay.write("payments.tf", (pay.dir / "payments.tf").read_text().replace("pay-v2", "pay-v3")
              + 'output "search_total" {\n  value = 2\n}\n')
    outside = pay.kl("apply", "-f", "payments.tf", "--confirm-scope", "--actor", "pay")
    assert outside.returncode != 0 and "'output.search_total' (write)" in outside.stderr, outside.stderr
    assert "nearest scope it has is '*:read'" in outside.stderr
    assert head(state, admin) == after

    # A file that reaches outside: the search file now also writes the shared resource. Refused when the run
    # opens, which is before Terraform applies anything.
    srch.write("search.tf", FILES["search.tf"].replace("recherche-v1", "recherche-v3")
               + 'resource "terraform_data" "shared_copy" {\n  input = terraform_data.shared.output\n}\n')
    refused = srch.kl("apply", "-f", "search.tf", "--confirm-scope", "--actor", "search")
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "address_scope" in refused.stderr or "address scopes" in refused.stderr, refused.stderr
    assert "terraform_data.shared_copy" in refused.stderr
    untouched = head(state, admin)
    assert untouched[""] == after[""] and "terraform_data.shared_copy" not in untouched
    label = untouched["terraform_data.search[0]"]["instance"]["attributes"]["input"]["value"]["label"]
    assert label == "recherche-v2 é"
    events = requests.get(f"{state}/events", headers=bearer(admin), timeout=10).json()["events"]
    audited = [e for e in events if e["kind"] == "address_scope_refused"]
    assert audited and audited[0]["detail"]["token"] == "search"
    assert audited[0]["detail"]["glob"].startswith("terraform_data.shared_copy")

    # Terraform's own whole-state calls need '*': payments may read but not LOCK or write the whole state.
    pay.tf("init", "-input=false")
    assert pay.tf("plan", "-input=false", "-lock=false", "-refresh=false", check=False).returncode == 0
    locked = pay.tf("apply", "-auto-approve", "-input=false", check=False)
    assert locked.returncode != 0 and "Error acquiring the state lock" in locked.stderr, locked.stdout + locked.stderr
    backend = state.replace("/v1/engine/states/", "/v1/states/")
    whole = requests.get(backend, headers=bearer(admin), timeout=10).content
    lock = requests.request("LOCK", backend, data=b'{"ID": "x"}', headers=bearer(payments), timeout=10)
    post = requests.post(backend, data=whole, headers=bearer(payments), timeout=10)
    assert (lock.status_code, post.status_code) == (403, 403)
    assert "do not allow Terraform's LOCK of '*' (write)" in lock.text and "'*:read'" in lock.text
    assert head(state, admin)[""] == after[""]
    assert requests.get(backend, headers=bearer(payments), timeout=10).content == whole  # '*:read' may GET
    no_get = srch.tf("init", "-input=false", check=False)  # search has no '*:read': not even a GET
    assert no_get.returncode != 0 or srch.tf("plan", "-input=false", "-lock=false", check=False).returncode != 0

    # Reads are filtered to the search token's read scopes.
    listing = requests.get(f"{state}/resources", headers=bearer(search), timeout=10).json()["resources"]
    assert sorted(r["address"] for r in listing) == [
        "terraform_data.search[0]", "terraform_data.search[1]", "terraform_data.shared"]
    sliced = requests.post(f"{state}/slice", json={"globs": ["*"]}, headers=bearer(search), timeout=10).json()
    assert sorted(sliced["outputs"]) == ["search_ids"]
    assert {r["type"] + "." + r["name"] for r in sliced["resources"]} == {
        "terraform_data.search", "terraform_data.shared"}
    history = requests.get(f"{state}/history", params={"address": 'module.payments["eu"].terraform_data.svc'},
                           headers=bearer(search), timeout=10)
    assert history.status_code == 403 and history.json()["code"] == "address_scope"
    seen = requests.get(f"{state}/events", params={"limit": 1000}, headers=bearer(search), timeout=10).json()
    assert not any("module.payments" in json.dumps(e["detail"]) for e in seen["events"])
    assert any(e["kind"] == "run_commit" and e["actor"] == "search" for e in seen["events"])


def test_a_plan_only_token_plans_but_cannot_apply_or_lock(world):  # type: ignore[no-untyped-def]
    server, repo, admin, state = world
    planner = make_token(server.url, "pr-plan", plan_only=True)
    assert planner["token"]["scopes"] == ["*:read"]
    work = checkout(repo, "plan", planner)
    work.edit("payments.tf", "pay-v1", "pay-v9")
    planned = work.kl("plan", "--changed-from", "HEAD", "--out", "pr.igplan")  # as the plan workflow runs it
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "File-scoped: payments.tf" in planned.stdout and "write module.payments" in planned.stdout
    before = head(state, admin)[""]
    applied = work.kl("apply", "-f", "payments.tf", "--confirm-scope", "--actor", "pr")
    assert applied.returncode != 0 and "address_scope" in applied.stderr + applied.stdout, applied.stderr
    assert work.tf("apply", "-auto-approve", "-input=false", check=False).returncode != 0
    assert head(state, admin)[""] == before
