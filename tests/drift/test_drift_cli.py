"""kl drift and kl refresh end to end: the fakecloud provider, real Terraform, a live server. Objects are
changed or deleted behind Terraform's back by editing the cloud's files."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest
import requests

from tests.conftest import held_until

pytestmark = pytest.mark.terraform
# A drifted value long enough never to appear by chance in a run id, a serial or a time beside it.
DRIFTED_SIZE = 48213907

SECRET = "s3cret-value-that-must-never-leak"


def _metric(text: str, name: str, **labels: str) -> float | None:
    for found in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) == labels:
            return float(found.group(2))
    return None


def test_drift_names_the_instance_and_attribute_and_leaves_the_trunk_alone(cloud_repo, live_server):
    before = cloud_repo.trunk()
    cloud_repo.cloud.edit("local", "bucket", "logs", size=DRIFTED_SIZE)
    done = cloud_repo.kl("drift")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "drifted  fakecloud_bucket.logs: size" in done.stdout
    assert str(DRIFTED_SIZE) not in done.stdout
    assert cloud_repo.trunk()["serial"] == before["serial"]
    assert cloud_repo.instance("fakecloud_bucket.logs")["size"] == 10

    report = requests.get(f"{live_server.url}/v1/engine/states/cloud/drift", timeout=10).json()
    [entry] = report["drifted"]
    # the last change Kilolock recorded for the instance, so a console edit reads apart from a bad apply
    assert entry.pop("last_change").startswith("created by anonymous via terraform at serial 1, ")
    assert entry == {"address": "fakecloud_bucket.logs", "attributes": ["size"], "gone": False}
    assert report["serial"] == before["serial"] and report["checked_at"]
    metrics = requests.get(f"{live_server.url}/metrics", timeout=10).text
    assert _metric(metrics, "kilolock_drifted_instances", state="cloud") == 1
    assert _metric(metrics, "kilolock_drift_checks_total", state="cloud", outcome="drifted") == 1
    assert _metric(metrics, "kilolock_drift_checks_total", state="cloud", outcome="clean") == 0
    # The check held read reservations only, and released them.
    assert requests.get(f"{live_server.url}/v1/engine/reservations", timeout=10).json()["reservations"] == []


def test_json_output_data_sources_never_count_and_a_clean_check_exits_0(cloud_repo):
    code, doc = cloud_repo.drift_json()
    assert code == 0 and doc["drifted"] == [] and doc["state"] == "cloud"
    assert doc["checked"] == 5  # four buckets/queues and terraform_data.note; never the data source
    cloud_repo.cloud.edit("local", "queue", "jobs", delay=1, bucket="elsewhere")
    code, doc = cloud_repo.drift_json("--target", "fakecloud_queue.jobs")
    assert code == 2 and doc["checked"] == 1
    assert doc["drifted"] == [{"address": "fakecloud_queue.jobs", "attributes": ["bucket", "delay"], "gone": False}]
    assert set(doc) == {"state", "serial", "checked", "drifted"}


def test_a_resource_type_glob_checks_every_resource_of_that_type(cloud_repo):
    cloud_repo.cloud.edit("local", "bucket", "logs", size=DRIFTED_SIZE)
    cloud_repo.cloud.edit("local", "queue", "jobs", delay=3)
    code, doc = cloud_repo.drift_json("--target", "fakecloud_bucket.*")
    assert code == 2 and doc["checked"] == 3, doc  # logs, backup (another region) and archive; not the data source
    assert doc["drifted"] == [{"address": "fakecloud_bucket.logs", "attributes": ["size"], "gone": False}]
    code, doc = cloud_repo.drift_json("--target", "fakecloud_queue.*")
    assert code == 2 and doc["checked"] == 1, doc
    assert doc["drifted"] == [{"address": "fakecloud_queue.jobs", "attributes": ["delay"], "gone": False}]


def test_refresh_of_a_file_commits_the_refreshed_values_then_drift_is_clean(cloud_repo, live_server):
    serial = cloud_repo.serial()
    cloud_repo.cloud.edit("local", "bucket", "logs", size=42)
    code, _ = cloud_repo.drift_json("-f", "buckets.tf")
    assert code == 2
    done = cloud_repo.kl("refresh", "-f", "buckets.tf", "--actor", "carol")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"committed at serial {serial + 1}" in done.stdout
    assert cloud_repo.instance("fakecloud_bucket.logs")["size"] == 42
    code, doc = cloud_repo.drift_json("-f", "buckets.tf")
    assert code == 0 and doc["drifted"] == [], doc
    runs = requests.get(f"{live_server.url}/v1/engine/runs", params={"status": "committed"}, timeout=10).json()
    mine = [r for r in runs["runs"] if r["actor"] == "carol"]
    assert mine and mine[0]["committed_serial"] == serial + 1 and mine[0]["info"]["kind"] == "refresh"
    report = requests.get(f"{live_server.url}/v1/engine/states/cloud/drift", timeout=10).json()
    assert report["drifted"] == []
    # Nothing drifted now: a refresh writes no new serial.
    again = cloud_repo.kl("refresh", "-f", "buckets.tf", "--actor", "carol")
    assert again.returncode == 0 and "nothing changed on the trunk" in again.stdout, again.stdout + again.stderr
    assert cloud_repo.serial() == serial + 1


def test_a_deleted_object_is_reported_gone_and_removed_by_refresh(cloud_repo):
    assert cloud_repo.cloud.delete("east", "bucket", "archive")
    code, doc = cloud_repo.drift_json()
    assert code == 2
    assert doc["drifted"] == [{"address": "fakecloud_bucket.archive", "attributes": [], "gone": True}]
    dry = cloud_repo.kl("refresh", "--target", "fakecloud_bucket.archive", "--dry-run")
    assert dry.returncode == 0 and "nothing committed" in dry.stdout, dry.stdout + dry.stderr
    assert cloud_repo.instance("fakecloud_bucket.archive") is not None
    done = cloud_repo.kl("refresh", "--target", "fakecloud_bucket.archive", "--actor", "dave")
    assert done.returncode == 0 and "1 removed" in done.stdout, done.stdout + done.stderr
    assert cloud_repo.instance("fakecloud_bucket.archive") is None
    assert cloud_repo.instance("fakecloud_bucket.logs") is not None
    code, doc = cloud_repo.drift_json()
    assert code == 0, doc


def test_refresh_runs_beside_a_disjoint_apply_and_an_overlapping_one_names_the_holder(cloud_repo):
    cloud_repo.cloud.edit("east", "bucket", "archive", size=7)
    gate = cloud_repo.dir.parent / "release-apply"
    # An apply that holds its reservations until the test opens the gate.
    cloud_repo.write("misc.tf", (cloud_repo.dir / "misc.tf").read_text().replace('"v1"', '"v2"')
                     + 'resource "terraform_data" "slow" {\n  provisioner "local-exec" {\n'
                     f'    command = "{held_until(gate)}"\n'
                     '  }\n}\n')
    slow = cloud_repo.kl_popen("apply", "-f", "misc.tf", "--confirm-scope", "--actor", "erin")
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            held = requests.get(cloud_repo.url.replace("/v1/states/cloud", "/v1/engine/runs"), timeout=10).json()
            if any(r["actor"] == "erin" and r["status"] == "running" for r in held["runs"]):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the apply never started")
        overlapping = cloud_repo.kl("refresh", "--target", "terraform_data.note", "--actor", "grace")
        assert overlapping.returncode == 2, overlapping.stdout + overlapping.stderr
        assert "erin" in overlapping.stderr
        disjoint = cloud_repo.kl("refresh", "--target", "fakecloud_bucket.archive", "--actor", "frank")
        assert disjoint.returncode == 0 and "committed at serial" in disjoint.stdout, disjoint.stdout + disjoint.stderr
        assert slow.poll() is None, "the apply was meant to still hold its reservations"
    finally:
        gate.write_text("go")
    out, err = slow.communicate(timeout=300)
    assert slow.returncode == 0 and "committed at serial" in out, out + err
    assert cloud_repo.instance("fakecloud_bucket.archive")["size"] == 7
    assert cloud_repo.instance("terraform_data.note")["input"]["value"] == "v2"


def test_sensitive_drift_is_named_but_its_value_appears_nowhere(cloud_repo, live_server, caplog):
    cloud_repo.cloud.edit("local", "bucket", "logs", secret=SECRET)
    seen: list[str] = []
    drift = cloud_repo.kl("drift")
    seen += [drift.stdout, drift.stderr]
    assert drift.returncode == 2 and "fakecloud_bucket.logs: secret" in drift.stdout
    code, doc = cloud_repo.drift_json("--target", "fakecloud_bucket.logs")
    assert doc["drifted"][0]["attributes"] == ["secret"]
    refreshed = cloud_repo.kl("refresh", "-f", "buckets.tf", "--actor", "heidi")
    seen += [refreshed.stdout, refreshed.stderr]
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    for path in ("/drift", "/drift/history", "/events"):
        seen.append(requests.get(f"{live_server.url}/v1/engine/states/cloud{path}", timeout=10).text)
    seen.append(requests.get(f"{live_server.url}/metrics", timeout=10).text)
    seen.append(caplog.text)
    assert all(SECRET not in text for text in seen)
    # The trunk itself holds the secret (Terraform's state does); the reports never do.
    assert cloud_repo.instance("fakecloud_bucket.logs")["secret"] == SECRET


def test_drift_exits_1_when_the_server_is_unreachable_and_3_on_usage(cloud_repo):
    down = cloud_repo.kl("drift", "--address", "http://127.0.0.1:9/v1/states/cloud")
    assert down.returncode == 1 and "cannot reach" in down.stderr, down.stderr
    both = cloud_repo.kl("drift", "-f", "buckets.tf", "--target", "fakecloud_bucket.logs")
    assert both.returncode == 3, both.stderr
    bad = cloud_repo.kl("drift", "--target", "module.")
    assert bad.returncode == 3, bad.stderr


@pytest.mark.skipif(shutil.which("terraform") is None, reason="no Terraform on PATH")
def test_drift_with_the_machines_terraform(cloud_repo):
    import os

    binary = shutil.which("terraform")
    cloud_repo.cloud.edit("local", "bucket", "logs", labels={"team": "x"})
    done = cloud_repo.kl("drift", env={"KL_TERRAFORM_BIN": binary or "", "PATH": os.environ["PATH"]})
    assert done.returncode == 2 and "fakecloud_bucket.logs: labels" in done.stdout, done.stdout + done.stderr


def test_plan_refresh_sees_drift_in_what_it_changes_and_the_apply_puts_it_back(cloud_repo):
    cloud_repo.cloud.edit("local", "bucket", "logs", size=DRIFTED_SIZE)
    plain = cloud_repo.kl("plan", "-f", "buckets.tf")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    # Without refresh no managed instance changes; the data source reading the bucket is read at plan time
    # (as by vanilla `terraform plan -refresh=false`), so the output built from it shows the new size, and the
    # data source itself (it reads what the selection writes) is re-read and committed.
    plain_spec = json.loads((cloud_repo.dir / ".kilolock" / "kl-plan.igplan").read_text())
    assert plain_spec["write_set"] == ["data.fakecloud_bucket.logs"]
    assert plain_spec["output_changes"] == {"logs_size": "update"}
    refreshed = cloud_repo.kl("plan", "-f", "buckets.tf", "--refresh")
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    assert "fakecloud_bucket.logs changed outside Terraform: size" in refreshed.stdout
    assert str(DRIFTED_SIZE) not in refreshed.stdout
    spec = json.loads((cloud_repo.dir / ".kilolock" / "kl-plan.igplan").read_text())
    assert spec["refresh"] is True and spec["write_set"] == ["data.fakecloud_bucket.logs", "fakecloud_bucket.logs"]
    applied = cloud_repo.kl("apply", ".kilolock/kl-plan.igplan", "--actor", "ivan")
    # The object is put back as configured, which is what the trunk already said: no new serial.
    assert applied.returncode == 0 and "nothing changed on the trunk" in applied.stdout, applied.stdout + applied.stderr
    assert cloud_repo.cloud.get("local", "bucket", "logs")["size"] == 10
    code, _ = cloud_repo.drift_json()
    assert code == 0
    cloud_repo.converged()
