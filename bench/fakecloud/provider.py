"""The ``fakecloud`` Terraform provider (written with PyPI's ``tf`` framework) over ``bench.fakecloud.cloud``.

Resources ``fakecloud_bucket`` (a sensitive ``secret``, computed ``id``/``arn``/``region``) and
``fakecloud_queue`` (references a bucket by name), data source ``fakecloud_bucket``; the provider's
``region`` (default ``local``) separates objects, so aliased configurations see different objects.
The cloud's directory is the provider's ``root`` argument, else ``FAKECLOUD_ROOT``.
A resource whose object vanished reads as gone, so Terraform's refresh removes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tf import provider as tfp
from tf import schema, types
from tf.iface import (
    Config,
    CreateContext,
    DeleteContext,
    ReadContext,
    ReadDataContext,
    State,
    UpdateContext,
    UpgradeContext,
)
from tf.runner import run_provider
from tf.utils import Diagnostics

from bench.fakecloud.cloud import Cloud, CloudError

HOST, NAMESPACE, TYPE, VERSION = "kilolock.test", "kilolock", "fakecloud", "0.1.0"
SOURCE = f"{HOST}/{NAMESPACE}/{TYPE}"


class FakeCloudProvider(tfp.Provider):
    def __init__(self) -> None:
        self.cloud = Cloud(Path(os.environ.get("FAKECLOUD_ROOT", ".fakecloud")))
        self.region = "local"

    def full_name(self) -> str:
        return SOURCE

    def get_model_prefix(self) -> str:
        return "fakecloud_"

    def get_provider_schema(self, diags: Diagnostics) -> schema.Schema:
        return schema.Schema(attributes=[
            schema.Attribute("region", types.String(), optional=True),
            schema.Attribute("root", types.String(), optional=True),
        ])

    def validate_config(self, diags: Diagnostics, config: Config) -> None:
        region = config.get("region")
        if region is not None and (not region or "/" in region):
            diags.add_error(f"invalid region {region!r}")

    def configure_provider(self, diags: Diagnostics, config: Config) -> None:
        self.region = config.get("region") or "local"
        if config.get("root"):
            self.cloud = Cloud(Path(config["root"]))

    def get_data_sources(self) -> list[type[tfp.DataSource]]:
        return [BucketData]

    def get_resources(self) -> list[type[tfp.Resource]]:
        return [Bucket, Queue]


_COMPUTED = [
    schema.Attribute("id", types.String(), computed=True),
    schema.Attribute("arn", types.String(), computed=True),
    schema.Attribute("region", types.String(), computed=True),
]


class _Object(tfp.Resource):
    """A named object of one ``kind`` in the cloud; ``fields`` are stored, ``attributes`` are their schema."""

    kind = ""
    fields: tuple[str, ...] = ()
    attributes: tuple[schema.Attribute, ...] = ()

    @classmethod
    def get_name(cls) -> str:
        return cls.kind

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(attributes=[
            schema.Attribute("name", types.String(), required=True, requires_replace=True),
            *cls.attributes,
            *_COMPUTED,
        ])

    def __init__(self, provider: FakeCloudProvider) -> None:
        self.provider = provider

    def _arn(self, name: str) -> str:
        return f"fc:{self.provider.region}:{self.kind}/{name}"

    def _check(self, ctx: CreateContext | UpdateContext, planned: State) -> bool:
        return True

    def _store(self, planned: State) -> State:
        name = planned["name"]
        obj = {f: planned.get(f) for f in self.fields}
        self.provider.cloud.put(self.provider.region, self.kind, name, obj)
        return {**planned, "id": f"{self.kind}-{name}", "arn": self._arn(name), "region": self.provider.region}

    def create(self, ctx: CreateContext, planned: State) -> State | None:
        if self.provider.cloud.get(self.provider.region, self.kind, planned["name"]) is not None:
            ctx.diagnostics.add_error(f"{self.kind} {planned['name']!r} already exists in {self.provider.region}")
            return None
        if not self._check(ctx, planned):
            return None
        return self._store(planned)

    def read(self, ctx: ReadContext, current: State) -> State | None:
        obj = self.provider.cloud.get(current.get("region") or self.provider.region, self.kind, current["name"])
        if obj is None:
            return None  # gone: Terraform drops it from the state
        return {**current, **{f: obj.get(f) for f in self.fields}}

    def update(self, ctx: UpdateContext, current: State, planned: State) -> State | None:
        if not self._check(ctx, planned):
            return None
        return self._store(planned)

    def upgrade(self, ctx: UpgradeContext, version: int, old: State) -> State | None:
        return old  # one schema version so far: nothing to upgrade

    def delete(self, ctx: DeleteContext, current: State) -> None:
        self.provider.cloud.delete(current.get("region") or self.provider.region, self.kind, current["name"])


class Bucket(_Object):
    kind = "bucket"
    fields = ("size", "labels", "secret")
    attributes = (
        schema.Attribute("size", types.Number(), optional=True),
        schema.Attribute("labels", types.Map(types.String()), optional=True),
        schema.Attribute("secret", types.String(), optional=True, sensitive=True),
    )


class Queue(_Object):
    kind = "queue"
    fields = ("bucket", "delay")
    attributes = (
        schema.Attribute("bucket", types.String(), required=True),
        schema.Attribute("delay", types.Number(), optional=True),
    )

    def _check(self, ctx: CreateContext | UpdateContext, planned: State) -> bool:
        if self.provider.cloud.get(self.provider.region, "bucket", planned["bucket"]) is None:
            ctx.diagnostics.add_error(f"queue {planned['name']!r}: no bucket {planned['bucket']!r} in "
                                      f"{self.provider.region}")
            return False
        return True


class BucketData(tfp.DataSource):
    def __init__(self, provider: FakeCloudProvider) -> None:
        self.provider = provider

    @classmethod
    def get_name(cls) -> str:
        return "bucket"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(attributes=[
            schema.Attribute("name", types.String(), required=True),
            schema.Attribute("size", types.Number(), computed=True),
            *_COMPUTED,
        ])

    def read(self, ctx: ReadDataContext, config: Config) -> State | None:
        region = self.provider.region
        try:
            obj = self.provider.cloud.get(region, "bucket", config["name"])
        except CloudError as exc:
            ctx.diagnostics.add_error(str(exc))
            return None
        if obj is None:
            ctx.diagnostics.add_error(f"no bucket {config['name']!r} in {region}")
            return None
        name = config["name"]
        return {"name": name, "size": obj.get("size"), "id": f"bucket-{name}", "arn": f"fc:{region}:bucket/{name}",
                "region": region}


def main() -> None:
    run_provider(FakeCloudProvider())
