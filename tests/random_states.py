"""Seeded random walks through v4 states: each step creates, updates and deletes instances (of single,
count and for_each resources, in modules, data sources, deposed objects), whole resources (some named to
sort between existing ones) and outputs of every JSON shape."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from bench.states import PROVIDER

OTHER_PROVIDER = 'provider["registry.terraform.io/hashicorp/null"]'
VALUES: list[Any] = [
    None, True, False, 0, -1, 2**63 - 1, 2**64 + 7, 1.5, -0.25, 1e-7, 1e16, "", "plain", "üñí©ødé ✓ 😀",
    "<b>&amp;</b>", "\u2028\u2029", "tab\tquote\"slash\\", [], {}, [[[]]], {"": {}},
    {"z": 1, "a": [1, {"b": None}]}, list(range(4)), "\n    {\n        {", "\n      ]\n    },",
]
_MODULES = ["", "", "", 'module.net["a"]', "module.app", 'module.app.module.db[0]']


class RandomStates:
    """A state that ``step`` changes at random; ``doc`` is its v4 document."""

    def __init__(self, seed: int, lineage: str = "walk", provider_changes: bool = True) -> None:
        self.rng = random.Random(seed)
        self.provider_changes = provider_changes
        self.lineage = lineage
        # (module, mode, type, name) -> {"provider", "keys": "none"|"count"|"each", "objects": {(key, deposed): attrs}}
        self.resources: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.serial = 1
        for _ in range(6):
            self._new_resource()
        for _ in range(3):
            self._set_output()

    def _value(self) -> Any:
        return copy.deepcopy(self.rng.choice(VALUES))

    def _new_resource(self) -> None:
        rng = self.rng
        mode = "data" if rng.random() < 0.15 else "managed"
        # Names spaced out so later ones sort between earlier ones.
        key = (rng.choice(_MODULES), mode, rng.choice(["terraform_data", "null_resource"]),
               f"r{rng.randrange(10, 1000)}")
        if key in self.resources:
            return
        keys = rng.choice(["none", "count", "each"])
        res = {"provider": rng.choice([PROVIDER, PROVIDER, OTHER_PROVIDER]), "keys": keys, "objects": {}}
        self.resources[key] = res
        for _ in range(1 if keys == "none" else rng.randrange(1, 6)):
            self._new_instance(key)

    def _new_instance(self, key: tuple[str, str, str, str]) -> None:
        res = self.resources[key]
        index: int | str | None
        if res["keys"] == "none":
            index = None
        elif res["keys"] == "count":
            index = self.rng.randrange(0, 30)
        else:
            index = self.rng.choice(["a", "b", "é", "<x>", "zz", "0", "a b", "k" + str(self.rng.randrange(50))])
        res["objects"][(index, "")] = self._attrs()

    def _attrs(self) -> dict[str, Any]:
        return {"id": str(self.rng.randrange(10**6)), "input": {"value": self._value(), "type": "dynamic"},
                "extra": self._value()}

    def _set_output(self) -> None:
        name = self.rng.choice(["a", "b", "out_é", "z", "m<&>", "list", "n"])
        self.outputs[name] = {"value": self._value(), "type": "dynamic",
                              **({"sensitive": True} if self.rng.random() < 0.3 else {})}

    def step(self) -> None:
        """One to four random changes, at the next serial."""
        rng = self.rng
        for _ in range(rng.randrange(1, 5)):
            kind = rng.random()
            live = [k for k, r in self.resources.items() if r["objects"]]
            if kind < 0.3 and live:
                res = self.resources[rng.choice(live)]
                obj = rng.choice(sorted(res["objects"], key=repr))
                res["objects"][obj] = self._attrs()
            elif kind < 0.45 and live:
                key = rng.choice(live)
                if self.resources[key]["keys"] != "none":
                    self._new_instance(key)
            elif kind < 0.55 and live:
                res = self.resources[rng.choice(live)]
                del res["objects"][rng.choice(sorted(res["objects"], key=repr))]
            elif kind < 0.62 and live:
                del self.resources[rng.choice(live)]
            elif kind < 0.75:
                self._new_resource()
            elif kind < 0.82 and live:
                key = rng.choice(live)
                res = self.resources[key]
                if key[1] == "managed":
                    index, _ = rng.choice(sorted(res["objects"], key=repr))
                    res["objects"][(index, f"{rng.randrange(16**8):08x}")] = self._attrs()
            elif kind < 0.84 and live and self.provider_changes:
                res = self.resources[rng.choice(live)]
                res["provider"] = OTHER_PROVIDER if res["provider"] == PROVIDER else PROVIDER
            elif kind < 0.92:
                self._set_output()
            elif self.outputs:
                del self.outputs[rng.choice(sorted(self.outputs))]
        self.resources = {k: r for k, r in self.resources.items() if r["objects"]}
        self.serial += 1

    def addresses(self) -> set[str]:
        """Every instance address in the state."""
        return {_address(key, index) for key, res in self.resources.items() for index, _ in res["objects"]}

    def doc(self) -> dict[str, Any]:
        resources = []
        for (module, mode, type_, name), res in self.resources.items():
            instances = []
            for (index, deposed), attrs in res["objects"].items():
                body: dict[str, Any] = {} if index is None else {"index_key": index}
                if deposed:
                    body.update(status="tainted", deposed=deposed)
                body.update(schema_version=0, attributes=attrs, sensitive_attributes=[])
                instances.append(body)
            resource: dict[str, Any] = {"module": module} if module else {}
            resource.update(mode=mode, type=type_, name=name, provider=res["provider"], instances=instances)
            resources.append(resource)
        return {"version": 4, "terraform_version": "1.15.5", "serial": self.serial, "lineage": self.lineage,
                "outputs": copy.deepcopy(self.outputs), "resources": resources}


def _address(key: tuple[str, str, str, str], index: int | str | None) -> str:
    module, mode, type_, name = key
    text = f"{type_}.{name}" if mode == "managed" else f"data.{type_}.{name}"
    if module:
        text = f"{module}.{text}"
    if index is not None:
        text += f"[{json.dumps(index, ensure_ascii=False)}]" if isinstance(index, str) else f"[{index}]"
    return text
