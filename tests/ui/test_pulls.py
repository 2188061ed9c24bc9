"""/ui/pulls over the bot's own tables: open pull requests per repository with their predicted
footprints, the overlaps between them, their checks and their last apply, linked to GitHub."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.store import bot
from tests.ui.conftest import TOKEN, login, page


@pytest.fixture
def bot_ui(static_settings: Any) -> Any:
    from app.web import create_app

    application = create_app(replace(static_settings, github_token="ghp_test", github_webhook_secret="w" * 32,
                                     github_api_url="https://ghe.example.com/api/v3"))
    client = application.test_client()
    assert login(client, TOKEN).status_code == 302
    client.environ_base["HTTP_ACCEPT"] = "text/html"
    yield client, application.extensions["kilolock"].db
    application.extensions["kilolock"].db.close()


def test_open_pull_requests_show_footprints_overlaps_checks_and_last_apply(bot_ui):
    client, db = bot_ui
    bot.save_footprint(db, bot.PrFootprint("acme/infra", 7, "network", "prod", "a" * 40, ("net.tf",),
                                           ("module.net.*",), ("data.aws_region.current",)))
    bot.save_footprint(db, bot.PrFootprint("acme/infra", 9, "network", "prod", "b" * 40, ("net.tf", "dns.tf"),
                                           ("module.net.*", "aws_route53_record.www"), ()))
    bot.save_footprint(db, bot.PrFootprint("acme/infra", 11, "db", "prod", "c" * 40, ("db.tf",),
                                           ("aws_db_instance.main",), ()))
    bot.save_footprint(db, bot.PrFootprint("acme/apps", 3, "web", "apps", "d" * 40, ("web.tf",), ("module.net.*",)))
    bot.claim_job(db, "pr-7", "pull_request", "acme/infra", number=7, sha="a" * 40)
    bot.finish_job(db, "pr-7", "succeeded", {"footprint": {"projects": [{"name": "network"}]}})
    bot.claim_job(db, "apply-7", "apply_project", "acme/infra", number=7, sha="e" * 40)
    bot.finish_job(db, "apply-7", "failed", {"apply": {"status": "failed", "error": "terraform apply exited 1"}},
                   error="terraform apply exited 1")
    html = page(client, "/ui/pulls")
    assert "not set up" not in html
    infra = html.split('data-repo="acme/infra"', 1)[1].split("</section>", 1)[0]
    apps = html.split('data-repo="acme/apps"', 1)[1].split("</section>", 1)[0]
    rows = {int(chunk.split('"', 1)[0]): chunk for chunk in infra.split('data-number="')[1:]}
    assert set(rows) == {7, 9, 11}
    assert 'href="https://ghe.example.com/acme/infra/pull/7"' in rows[7]
    assert "module.net.*" in rows[7] and "data.aws_region.current" in rows[7] and "net.tf" in rows[7]
    # 7 and 9 both write module.net.*; 11 touches nothing of theirs; the other repository never counts.
    assert "/acme/infra/pull/9" in rows[7].split('class="overlaps"', 1)[1].split("</td>", 1)[0]
    assert "/acme/infra/pull/7" in rows[9].split('class="overlaps"', 1)[1].split("</td>", 1)[0]
    assert "none" in rows[11].split('class="overlaps"', 1)[1].split("</td>", 1)[0]
    assert "pull/3" not in infra and "/acme/apps/pull/3" in apps
    checks = rows[7].split('class="checks"', 1)[1].split("</td>", 1)[0]
    assert "pull_request" in checks and "succeeded" in checks and "1 project(s)" in checks
    last = rows[7].split('class="last-apply"', 1)[1].split("</td>", 1)[0]
    assert "apply_project" in last and "failed" in last and "terraform apply exited 1" in last
    assert "never applied" in rows[9]
    bot.drop_footprints(db, "acme/infra", 9)  # merged or closed: no longer open
    assert 'data-number="9"' not in page(client, "/ui/pulls")


def test_with_the_bot_set_up_and_nothing_open_the_page_says_so(bot_ui):
    client, _ = bot_ui
    assert "No open pull requests with a predicted footprint" in page(client, "/ui/pulls")


def test_a_web_process_without_github_credentials_shows_what_the_workers_recorded(static_settings):
    from app.web import create_app

    application = create_app(static_settings)  # no KL_GITHUB_*: the credentials live on the workers
    db = application.extensions["kilolock"].db
    try:
        client = application.test_client()
        assert login(client, TOKEN).status_code == 302
        client.environ_base["HTTP_ACCEPT"] = "text/html"
        assert "The GitHub bot is not set up" in page(client, "/ui/pulls")  # nothing recorded anywhere yet
        bot.record_delivery(db, "d-1", "pull_request", "opened", "acme/infra")
        html = page(client, "/ui/pulls")
        assert "not set up" not in html and "No open pull requests with a predicted footprint" in html
        assert "workers recorded" in html
        bot.save_footprint(db, bot.PrFootprint("acme/infra", 5, "network", "prod", "f" * 40, ("net.tf",),
                                               ("module.net.*",), ()))
        html = page(client, "/ui/pulls")
        assert 'data-number="5"' in html and "not set up" not in html
    finally:
        db.close()
