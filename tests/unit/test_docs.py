"""The documentation stays true to the tree: the module map in docs/architecture.md names every
module of ``gateway/`` (and none that is gone), and every relative link and ``#anchor`` in the
README, docs/, BENCHMARKS.md and examples/README.md points at a file and heading that exist.
Files only: no Redis, no broker."""

from __future__ import annotations

import re
from pathlib import Path

from ..support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "BENCHMARKS.md",
        ROOT / "examples" / "README.md"]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _outside_fences(text: str) -> list[str]:
    lines, fence = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -1, -2 on
    repeats."""
    out: set[str] = set()
    for line in _outside_fences(path.read_text()):
        m = re.match(r"^#+ (.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n, base = 0, slug
            while slug in out:
                n += 1
                slug = f"{base}-{n}"
            out.add(slug)
    return out


def test_the_module_map_names_every_module() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## Module map"):]
    listed = set(re.findall(r"^\| `(gateway/[\w/]+\.py)` \|", table, re.M))
    tree = {str(p.relative_to(ROOT)) for p in (ROOT / "gateway").rglob("*.py")}
    assert not tree - listed, f"modules missing from the module map: {sorted(tree - listed)}"
    assert not listed - tree, f"the module map names modules that are gone: {sorted(listed - tree)}"


def test_links_and_anchors_resolve() -> None:
    bad = []
    for doc in DOCS:
        for target in _LINK.findall("\n".join(_outside_fences(doc.read_text()))):
            if re.match(r"^(https?|mailto):", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_user_docs_cite_nothing_a_user_cannot_read() -> None:
    """The design seeds (``../shared/seeds``) are not shipped: "as in seed 001" told a user
    nothing. The user's documents and the API spec say what they mean instead."""
    for path in [*(p for p in DOCS if p.name != "BENCHMARKS.md"), ROOT / "openapi.yaml"]:
        text = path.read_text()
        assert not re.search(r"\bseeds?[ /]0\d\d", text), path
