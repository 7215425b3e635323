"""openapi.yaml parses (a quoting slip broke every system test that checks answers against it,
and no fast test noticed); the system tests check the running app against it."""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..support import ROOT


class _UniqueKeys(yaml.SafeLoader):
    """A loader that refuses a key given twice in one mapping: YAML keeps the last silently, and
    a second ``AlertThresholds`` replaced the registration's schema (schemathesis noticed)."""


def _mapping(loader: _UniqueKeys, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(k) for k, _ in node.value]  # type: ignore[no-untyped-call]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    assert not twice, f"keys given twice near line {node.start_mark.line + 1}: {twice}"
    return loader.construct_mapping(node)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def test_no_key_is_given_twice() -> None:
    yaml.load((ROOT / "openapi.yaml").read_text(), Loader=_UniqueKeys)  # a SafeLoader


def test_the_spec_parses_and_names_its_schemas() -> None:
    # the package's copy is a link to the top-level spec (an editor that replaces the file
    # instead of writing through the link splits them: sed -i did)
    assert (ROOT / "gateway" / "openapi.yaml").is_symlink()
    spec: dict[str, Any] = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    schemas = spec["components"]["schemas"]
    assert "shards" in schemas["Consumer"]["properties"]
    refs = re.findall(r"#/components/(\w+)/(\w+)", (ROOT / "openapi.yaml").read_text())
    assert len(refs) > 100
    for kind, name in refs:  # every reference points at something defined
        assert name in spec["components"][kind], (kind, name)
