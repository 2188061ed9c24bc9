"""The SQL queries shown in docs/data-model.md run and answer what they claim."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from tests.helpers import instance, resource, state

DOC = Path(__file__).resolve().parents[2] / "docs" / "data-model.md"


def queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_data_model_page_shows_three_queries_that_run(client, clean_db):
    net = resource("vpc", [instance(None, "n")], module="module.network")
    for body in [
        state(1, [net, resource("app", [instance(None, "a", deps=["module.network.terraform_data.vpc"])]),
                  resource("old", [instance(None, "o")])]),
        state(2, [net, resource("app", [instance(None, "a2", deps=["module.network.terraform_data.vpc"])]),
                  resource("new", [instance(None, "x")])]),
    ]:
        assert client.post("/v1/states/prod", data=body).status_code == 200
    found = queries()
    assert len(found) == 3
    with psycopg.connect(clean_db) as conn:
        last_write = conn.execute(found[0]).fetchall()
        dependents = conn.execute(found[1]).fetchall()
        churn = conn.execute(found[2]).fetchall()
    assert last_write == [("terraform_data.app", "changed"), ("terraform_data.new", "created"),
                          ("terraform_data.old", "destroyed")]
    assert dependents == [("terraform_data.app", "module.network.terraform_data.vpc")]
    assert churn[0][:2] == ("terraform_data.app", 2)
