"""The README introduces and stays short; every relative link in README.md and docs/ points at a file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150  # issue 33: the README introduces; the manual and the measurements live in docs/

_FENCED_BLOCK = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_EXTERNAL = ("http://", "https://", "mailto:", "#")


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_link_targets(text: str) -> list[str]:
    """The targets of the inline links `[text](target)` outside code, minus URLs and in-page anchors."""
    prose = _CODE_SPAN.sub("", _FENCED_BLOCK.sub("", text))
    return [t for t in _INLINE_LINK.findall(prose) if not t.startswith(_EXTERNAL)]


def test_readme_is_an_introduction():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail under docs/ "
        "(docs/README.md lists where each kind goes) and link to it")


def test_every_relative_link_points_at_a_file():
    broken = []
    for path in _markdown_files():
        for target in relative_link_targets(path.read_text()):
            if not (path.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_link_reader_sees_links_and_skips_code():
    text = ("[a](docs/x.md) [b](https://e.org) [c](#top) `[d](not/a/link.md)`\n"
            "```\n[e](in/a/block.md)\n```\n[f](results/y.json#frag)\n")
    assert relative_link_targets(text) == ["docs/x.md", "results/y.json#frag"]
