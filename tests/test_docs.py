"""README and docs/ as a reader meets them: README is a first page (the two commands
near its top, short enough to read in five minutes), and every link between the
documents leads somewhere: to a file that exists and, with an #anchor, to a heading
in it (GitHub's slugs)."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", path.read_text()))
            if not re.match(r"[a-z]+:", t)]


def broken(path) -> list[str]:
    out = []
    for target in links(path):
        name, _, anchor = target.partition("#")
        where = (path.parent / name).resolve() if name else path
        if not where.exists():
            out.append(f"{path.name}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            out.append(f"{path.name}: {target}: no heading #{anchor} there")
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_link_leads_to_a_file_and_heading_that_exist(path):
    assert broken(path) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Some `code` here, too\n\n[x](b.md) "
                                   "[y](#some-code-here-too) [z](#nowhere) [w](https://x.y)\n"
                                   "```\n[not a link](c.md)\n```\n")
    assert broken(tmp_path / "a.md") == ["a.md: b.md: no such file",
                                         "a.md: #nowhere: no heading #nowhere there"]


def test_readme_is_a_first_page_with_both_commands_near_its_top():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    top = "\n".join(lines[:40])
    assert "make defconfig-gpt2-shakespeare-cpu && make\n" in top
    assert "make check\n" in top
