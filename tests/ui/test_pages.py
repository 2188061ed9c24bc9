"""Dashboard pages over real rows: the states list, one state with its filter and outputs, a
resource's lifecycles and neighbourhood, the runs timeline, run details, reservations and abort."""

from __future__ import annotations

import re

import psycopg

from tests.helpers import counted_state, lock_info
from tests.ui.conftest import TOKEN, csrf_of, page

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def cells(html: str, table_id: str) -> list[list[str]]:
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    return [[re.sub(r"<[^>]+>|\s+", " ", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in rows if "<td" in r]


def test_the_states_list_shows_serial_resources_lock_holder_reservations_and_last_write(ui, seeded):
    assert ui.post("/v1/states/other", data=counted_state(1, 4), headers=BEARER).status_code == 200
    ui.open("/v1/states/other", method="LOCK", data=lock_info("lock-1", who="erin@laptop"), headers=BEARER)
    rows = {r[0]: r for r in cells(page(ui, "/ui/"), "states")}
    assert rows["prod"][1:3] == ["2", "6"] and rows["prod"][4:6] == ["1", "1"]
    assert "alice (apply)" in rows["prod"][6]
    assert rows["other"][1:3] == ["1", "4"] and rows["other"][3].startswith("erin@laptop")


def test_the_states_list_has_an_empty_state(ui):
    assert "No states yet" in page(ui, "/ui/")


def test_a_state_page_filters_resources_by_any_part_of_the_address(ui, seeded):
    every = cells(page(ui, "/ui/states/prod"), "resources")
    assert len(every) == 6 and every[0][0] == "module.a.terraform_data.x"
    assert every[0][2] == "2"  # the commit opened a new lifecycle at serial 2
    filtered = page(ui, "/ui/states/prod?q=MODULE.B")
    assert [r[0] for r in cells(filtered, "resources")] == ["module.b.terraform_data.x"]
    assert "1 of 6 match" in filtered
    assert "No resources match" in page(ui, "/ui/states/prod?q=nothing-like-this")


def test_a_resource_history_shows_each_lifecycle_with_its_diff_and_the_neighbourhood(ui, seeded):
    html = page(ui, "/ui/states/prod/resource?address=module.a.terraform_data.x")
    assert "2 lifecycles" in html and "serial 2 → now" in html and "serial 1 → 2" in html
    newest = html.split('class="lifecycle card"')[1]
    assert "input.value" in newest and "&#34;a&#34;" in newest and "&#34;A2&#34;" in newest
    assert "input.type" not in newest  # unchanged attributes are not repeated
    assert 'terraform_data.web[&#34;blue&#34;]' in html.split('id="dependents"')[1].split("</ul>")[0]
    web = page(ui, "/ui/states/prod/resource?address=terraform_data.web%5B%22blue%22%5D")
    assert "module.a.terraform_data.x" in web.split('id="depends-on"')[1].split("</ul>")[0]


def test_unknown_states_runs_and_addresses_are_html_404s(ui, seeded):
    for path in ("/ui/states/nope", "/ui/states/nope/runs", "/ui/runs/ar_0000000000000000",
                 "/ui/states/prod/resource?address=terraform_data.never"):
        response = ui.get(path)
        assert response.status_code == 404 and "<h1>404" in response.get_data(as_text=True), path
    assert ui.get("/ui/states/prod/resource").status_code == 400
    assert ui.get("/ui/states/bad%20name").status_code == 400


def test_the_runs_page_of_a_state_without_runs_says_so(ui):
    assert ui.post("/v1/states/quiet", data=counted_state(1, 1), headers=BEARER).status_code == 200
    assert "No apply runs yet" in page(ui, "/ui/states/quiet/runs")


def test_the_runs_pages_draw_one_bar_per_run_with_status_and_serial(ui, seeded):
    html = page(ui, "/ui/states/prod/runs")
    bars = re.findall(r'<rect class="bar status-(\w+)[^"]*" data-run="(ar_\w+)"', html)
    assert sorted(bars) == sorted([("failed", seeded.failed), ("committed", seeded.committed),
                                   ("reserved", seeded.running)])
    assert ">#2</text>" in html
    assert seeded.running in page(ui, "/ui/runs")


def test_a_run_page_shows_reservations_counters_error_summary_and_its_events(ui, seeded):
    live = page(ui, f"/ui/runs/{seeded.running}")
    assert cells(live, "run-reservations")[0][:2] == ["module.b.*", "write"]
    assert 'id="abort-form"' in live and "run_open" in live and "reservation_acquire" in live
    failed = page(ui, f"/ui/runs/{seeded.failed}")
    assert "terraform apply exited 1" in failed and 'id="abort-form"' not in failed
    assert re.search(r"<th>applied</th><td class=\"num\">0</td>", failed)
    committed = page(ui, f"/ui/runs/{seeded.committed}")
    assert 'id="committed-serial">2<' in committed and "run_commit" in committed


def test_aborting_from_the_reservations_page_releases_the_run_and_is_audited(ui, seeded, clean_db):
    html = page(ui, "/ui/reservations")
    assert [r[3] for r in cells(html, "reservations")] == ["bob"]
    answer = ui.post(f"/ui/runs/{seeded.running}/abort",
                     data={"csrf_token": csrf_of(html), "reason": "stuck", "next": "/ui/reservations?"})
    assert answer.status_code == 302 and answer.headers["Location"].startswith("/ui/reservations")
    after = page(ui, "/ui/reservations")
    assert "aborted; its reservations are released" in after and "No live reservations" in after
    with psycopg.connect(clean_db) as conn:
        run = conn.execute("SELECT status, error_summary FROM apply_runs WHERE id = %s", (seeded.running,)).fetchone()
        event = conn.execute("SELECT actor, detail ->> 'reason' FROM events WHERE kind = 'run_abort'").fetchone()
    assert run == ("aborted", "aborted by operator: stuck") and event == ("operator", "stuck")
    again = ui.post(f"/ui/runs/{seeded.running}/abort", data={"csrf_token": csrf_of(after)})
    assert again.status_code == 302
    assert "already aborted" in page(ui, f"/ui/runs/{seeded.running}")


def test_the_terraform_lock_shows_as_a_reservation_without_an_abort_button(ui):
    ui.post("/v1/states/locked", data=counted_state(1, 1), headers=BEARER)
    ui.open("/v1/states/locked", method="LOCK", data=lock_info("lock-9", who="frank@ci"), headers=BEARER)
    html = page(ui, "/ui/reservations")
    [row] = cells(html, "reservations")
    assert row[1] == "*" and row[3] == "frank@ci" and "Terraform state lock" in row[4] and "force-unlock" in row[7]


def test_the_pull_requests_page_says_what_is_missing_when_the_bot_is_not_set_up(ui):
    html = page(ui, "/ui/pulls")
    assert "The GitHub bot is not set up" in html and "KL_GITHUB_WEBHOOK_SECRET" in html and "KL_GITHUB_TOKEN" in html


def test_a_live_terraform_lock_counts_as_a_live_reservation_on_the_states_list(ui):
    ui.post("/v1/states/locked", data=counted_state(1, 1), headers=BEARER)
    ui.open("/v1/states/locked", method="LOCK", data=lock_info("lock-2", who="gina@ci"), headers=BEARER)
    [row] = cells(page(ui, "/ui/"), "states")
    assert row[3].startswith("gina@ci") and row[4] == "1"


def test_the_site_root_redirects_to_the_dashboard(ui):
    response = ui.get("/")
    assert response.status_code == 302 and response.headers["Location"].endswith("/ui/")


def test_a_failed_run_page_points_at_the_kept_state_and_kl_recover(ui, seeded):
    html = page(ui, f"/ui/runs/{seeded.failed}")
    assert f"KL_DATA_DIR/runs/{seeded.failed}/" in html and f"kl recover {seeded.failed}" in html
    committed = page(ui, f"/ui/runs/{seeded.committed}")
    assert "kl recover" not in committed and 'id="counters"' in committed
    running = page(ui, f"/ui/runs/{seeded.running}")
    assert "No counters yet" in running and "has not committed yet" in running


def test_a_dry_run_reads_as_a_rehearsal_not_an_abort(ui):
    ui.post("/v1/states/rehearsed", data=counted_state(1, 1), headers=BEARER)
    opened = ui.post("/v1/engine/states/rehearsed/runs", headers=BEARER, json={
        "actor": "dora", "reservations": [{"glob": "*", "mode": "write"}], "info": {"dry_run": True}})
    run_id = opened.get_json()["run"]["id"]
    ui.post(f"/v1/engine/runs/{run_id}/close", headers=BEARER,
            json={"holder": "dora", "status": "aborted", "error_summary": "dry run: reservations released"})
    html = page(ui, f"/ui/runs/{run_id}")
    assert 'id="run-status">dry-run<' in html and "Nothing was applied" in html and "kl recover" not in html
    assert 'data-status="dry-run"' in page(ui, "/ui/runs")


def test_a_refused_login_keeps_the_name_typed(anon):
    from tests.ui.conftest import login

    refused = login(anon, "not-the-token", name="henry")
    assert refused.status_code == 403 and 'value="henry"' in refused.get_data(as_text=True)


def test_open_mode_audit_rows_name_the_runs_actor_not_anonymous(client, clean_db):
    client.post("/v1/states/open", data=counted_state(1, 1))
    opened = client.post("/v1/engine/states/open/runs", json={"actor": "ivy", "reservations": [
        {"glob": "*", "mode": "write"}]})
    run_id = opened.get_json()["run"]["id"]
    client.post(f"/v1/engine/runs/{run_id}/close", json={"holder": "ivy", "status": "failed", "error_summary": "x"})
    with psycopg.connect(clean_db) as conn:
        actors = {kind: actor for kind, actor in conn.execute(
            "SELECT kind, actor FROM events WHERE detail ->> 'run_id' = %s OR kind LIKE 'run%%'", (run_id,))}
    assert actors and set(actors.values()) == {"ivy"}, actors
    html = client.get(f"/ui/runs/{run_id}", headers={"Accept": "text/html"}).get_data(as_text=True)
    assert "anonymous" not in html.split('id="events"', 1)[1]


def test_manual_holds_show_with_holder_reason_and_expiry_on_the_reservations_page(ui):
    taken = ui.post("/v1/engine/states/frozen/holds", headers=BEARER,
                    json={"globs": ["module.db.*"], "reason": "freeze <b>now</b>", "until_seconds": 3600})
    assert taken.status_code == 201, taken.data
    hold = taken.get_json()["hold"]
    html = page(ui, "/ui/reservations")
    [row] = cells(html, "holds")
    assert row[0] == hold["id"] and row[1] == "frozen" and row[2] == "module.db.*"
    assert row[4] == "freeze &lt;b&gt;now&lt;/b&gt;" and "<b>now</b>" not in html  # escaped once
    assert row[5].endswith(" left"), row
    [reserved] = cells(html, "reservations")
    assert "manual hold" in reserved[3] and f"kl release {hold['id']}" in reserved[3]


def test_the_resource_page_links_each_change_to_its_run_and_the_blame_search_pages_a_glob(ui, seeded):
    history = page(ui, "/ui/states/prod/resource?address=module.a.terraform_data.x")
    # serial 2 came from alice's committed run: its link, and the POST of serial 1 named as a terraform write
    assert f'href="/ui/runs/{seeded.committed}">run {seeded.committed}</a>' in history
    assert "via terraform" in history
    found = page(ui, "/ui/states/prod/blame?glob=module.a.*")
    rows = re.findall(r'class="resource-link" href="[^"]+">([^<]+)</a>', found)
    assert rows == ["module.a.terraform_data.x"] and "changed: " in found and f"run {seeded.committed}" in found
    everything = page(ui, "/ui/states/prod/blame")
    assert "module.a.terraform_data.x" in everything and 'id="blame-next"' not in everything
    assert page(ui, "/ui/states/prod/blame?glob=module.[", status=400)
