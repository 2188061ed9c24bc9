"""Real Terraform against two tenants that both have a state named prod (database auth mode)."""

from __future__ import annotations

import pytest
import requests

from app.config import AuthMode

pytestmark = pytest.mark.terraform

CONTROL = "ctl-token"


def token(server_url: str, tenant: str, environment: str = "production") -> dict[str, str]:
    ctl = {"Authorization": f"Bearer {CONTROL}"}
    requests.post(f"{server_url}/v1/api/tenants", json={"slug": tenant}, headers=ctl, timeout=10)
    answer = requests.post(f"{server_url}/v1/api/tenants/{tenant}/tokens", headers=ctl, timeout=10,
                           json={"name": f"{tenant}-ci", "environment": environment})
    assert answer.status_code == 201, answer.text
    return answer.json()


def config(block: str, value: str) -> str:
    return block + f'\nresource "terraform_data" "app" {{\n  input = "{value}"\n}}\n'


def test_each_tenant_applies_its_own_prod_and_cannot_touch_the_others(live_server_factory, terraform_factory):
    server = live_server_factory(auth_mode=AuthMode.DATABASE, control_token=CONTROL)
    a, b = token(server.url, "alpha"), token(server.url, "beta")
    assert a["workspace_id"] != b["workspace_id"]

    tf_a, tf_b = terraform_factory("alpha"), terraform_factory("beta")
    tf_a.write("main.tf", config(a["backend_block"].replace("http://localhost", "http://127.0.0.1"), "from-alpha"))
    tf_b.write("main.tf", config(b["backend_block"].replace("http://localhost", "http://127.0.0.1"), "from-beta"))
    for tf, t in ((tf_a, a), (tf_b, b)):
        tf.env["TF_HTTP_PASSWORD"] = t["token_secret"]
        tf("init", "-input=false")
        tf("apply", "-auto-approve", "-input=false")
    assert '"from-alpha"' in tf_a("state", "pull").stdout
    assert '"from-beta"' in tf_b("state", "pull").stdout

    # beta's credentials on alpha's address: refused at init, never a 200
    intruder = terraform_factory("intruder")
    intruder.write("main.tf", config(a["backend_block"].replace("http://localhost", "http://127.0.0.1"), "evil"))
    intruder.env["TF_HTTP_PASSWORD"] = b["token_secret"]
    refused = intruder("init", "-input=false", check=False)
    assert refused.returncode != 0 and "from-alpha" not in refused.output
    # beta's own workspace as username with beta's secret, on alpha's path: still refused
    intruder.write("main.tf", config(a["backend_block"].replace("http://localhost", "http://127.0.0.1").replace(
        f'username       = "{a["workspace_id"]}"', f'username       = "{b["workspace_id"]}"'), "evil"))
    assert intruder("init", "-input=false", "-reconfigure", check=False).returncode != 0

    # a revoked token stops working on the next request
    requests.post(f"{server.url}/v1/api/tenants/alpha/tokens/{a['token']['id']}/revoke",
                  headers={"Authorization": f"Bearer {CONTROL}"}, timeout=10)
    after = tf_a("plan", "-input=false", check=False)
    assert after.returncode != 0
    assert requests.get(f"{server.url}/v1/states/{a['workspace_id']}/{a['environment_id']}/prod",
                        headers={"Authorization": f"Bearer {b['token_secret']}"}, timeout=10).status_code == 403
