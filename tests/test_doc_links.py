"""Every relative link in the project's Markdown reaches a file, and a `#anchor` a heading there.

The README and `docs/` cite each other by section (`results.md#against-the-targets`); a renamed
heading or a moved page breaks those links silently, and a reader lands on a page top or a 404.
Anchors are GitHub's: the heading in lower case, punctuation other than `-` and `_` dropped,
spaces as hyphens, a repeated heading suffixed `-1`, `-2`, ...
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("*/README.md"),
        *ROOT.glob("charts/*/README.md"),
    ]
)
# [text](target) outside code; images too. The target stops at whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> str:
    """The page outside fenced code blocks, inline code spans blanked (a link's text may wrap
    across lines, so the page stays whole)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group()), "\n".join(lines))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor `page`'s headings give, duplicates numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(1))
            out.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def broken_links(page: Path) -> list[str]:
    """`page`'s relative links whose file or anchor does not exist, as 'target: why'."""
    bad = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading gives #{anchor}")
    return bad


def test_slug_follows_github() -> None:
    assert slug("`make bench-http` again (2026-12-07, 11:42-12:09 UTC)") == (
        "make-bench-http-again-2026-12-07-1142-1209-utc"
    )
    assert slug("Where the H100 tail goes") == "where-the-h100-tail-goes"
    assert slug("[operator](../operator/README.md) scaling") == "operator-scaling"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Part one\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#part-one) [gone](a.md#part-two) [wrapped\ntext](c.md) `[code](x.md)`\n"
        "```\n[fenced](y.md)\n```\n[web](https://example.com/x.md)\n"
    )
    assert broken_links(page) == ["a.md#part-two: no heading gives #part-two", "c.md: no such file"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    assert broken_links(page) == []
