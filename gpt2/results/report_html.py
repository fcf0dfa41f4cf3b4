"""Markdown on the pages, made safe: report.md's comparison on the matrix page, and a
run's own notes.md on its page.

The comparison is the sections report.md opens with (the speedup and paired
differences, the tuned table with its under-tuned warnings and grids, sparsity at equal
cost...), up to its table of every result, which the page has as its sortable cell
table. One text, written once by gpt2/matrix/report.py, read by both: the page cannot
say other than the report.

The markdown is rendered with Python-Markdown (pinned in requirements.txt; TensorBoard
needs it too). Its text holds strings from the run folders (cell errors, a user's
notes), so nothing in it is trusted: the source is HTML-escaped before rendering, and
what comes out is rebuilt from an allowlist of tags and attributes, links and images
only to the folder's own files.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import markdown

from gpt2 import storage

# Where the comparison ends in report.md: the page shows every cell in its own table.
END = "## Results"
TAGS = {"h1", "h2", "h3", "h4", "p", "table", "thead", "tbody", "tr", "th", "td", "ul", "ol",
        "li", "strong", "em", "code", "pre", "blockquote", "hr", "img", "a", "br"}
VOID = {"img", "br", "hr"}
# Links and images point into the matrix folder only: its plots, cells and files.
LOCAL = re.compile(r"^(?:plots/|cells/)?[A-Za-z0-9][A-Za-z0-9._/-]*$")
ATTRIBUTES = {"img": {"src", "alt"}, "a": {"href"}}


class _Allowlist(HTMLParser):
    """Rebuilds HTML keeping only TAGS, their ATTRIBUTES, and local links.

    The markdown source was escaped before rendering (safe_markdown), and Markdown
    escapes a code span's or block's text once more, so inside ``code`` the text is
    unescaped once here: `a < b` shows as a < b, not as &lt; (it is escaped again on
    the way out, like all text)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.code = 0  # how deep inside <code> the parser is

    def handle_starttag(self, tag, attrs):
        if tag not in TAGS:
            return
        kept = []
        for name, value in attrs:
            if name not in ATTRIBUTES.get(tag, ()) or value is None:
                continue
            if name in ("src", "href") and (not LOCAL.match(value) or ".." in value):
                continue
            kept.append(f' {name}="{html.escape(value)}"')
        if tag == "img":
            kept.append(' loading="lazy"')
        self.code += tag == "code"
        self.out.append(f"<{tag}{''.join(kept)}>")

    def handle_endtag(self, tag):
        if tag in TAGS and tag not in VOID:
            self.code = max(0, self.code - (tag == "code"))
            self.out.append(f"</{tag}>")

    def handle_data(self, data):
        self.out.append(html.escape(html.unescape(data) if self.code else data, quote=False))


def safe_html(text: str) -> str:
    """``text`` (HTML) with every tag, attribute and link outside the allowlist gone."""
    parser = _Allowlist()
    parser.feed(text)
    parser.close()
    return "".join(parser.out)


def comparison(folder: Path) -> str:
    """The comparison sections of ``folder``/report.md as safe HTML ("" without a
    report, or with nothing before its results table)."""
    text = storage.read_text(Path(folder) / "report.md", follow=False)
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), None)
    if start is None:
        return ""
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(END)), len(lines))
    return safe_markdown("\n".join(lines[start:end]).strip())


def safe_markdown(source: str) -> str:
    """Markdown from a run's or a matrix's files as safe HTML: escaped first, rendered,
    then rebuilt from the allowlist ("" for no text)."""
    if not source.strip():
        return ""
    rendered = markdown.markdown(html.escape(source, quote=False), extensions=["tables", "fenced_code"])
    return safe_html(rendered)
