"""Every relative link in README.md and docs/*.md resolves: the file exists, and a `#fragment`
names a heading (as GitHub makes its anchor) or an `<a id>` in that file. Pure: reads text only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300  # the front door: what it is, a first success, one example per way in, links

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_EXPLICIT_ANCHOR = re.compile(r"<a\s+id=\"([^\"]+)\"")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {github_anchor(h) for h in _HEADING.findall(text)} | set(_EXPLICIT_ANCHOR.findall(text))


def relative_links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return [target for target in _LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_the_pages_exist():
    assert (ROOT / "docs" / "README.md") in PAGES and len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference text to docs/"


def test_github_anchor_matches_githubs_rule():
    assert github_anchor("The OpenAI Realtime endpoint: `/v1/realtime`") == "the-openai-realtime-endpoint-v1realtime"
    assert github_anchor("Cadence's own worker") == "cadences-own-worker"
    assert github_anchor("Latency: what is measured") == "latency-what-is-measured"
