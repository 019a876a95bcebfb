"""The documentation reads in one pass: no paragraph or list item in docs/ runs over 60 words (the Benchmarks and
Reproduction pages, which record measurements, excepted), the README's table cells stay under 31 words, and no code
line is clipped at the right edge of a 1280-px page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS = 60
MAX_CELL_WORDS = 30
RECORDS = {"benchmarks.md", "reproduction.md"}  # pages of measurements, read as tables and logs
# Monospace characters that fit the Material theme's content column at 1280 px (the code font is 0.85 of 16 px,
# about 8.2 px a character; the column between the two sidebars is about 650 px of code).
CODE_COLUMN_CHARS = 80
PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in RECORDS)


def paragraphs(markdown: str) -> list[str]:
    """The prose blocks of a page: paragraphs and list items (a new item starts a new block), not code, tables,
    headings or HTML comments."""
    blocks: list[str] = []
    current: list[str] = []
    fenced = False

    def close() -> None:
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        text = line.strip()
        if text.startswith("```"):
            fenced = not fenced
            close()
            continue
        if fenced or not text or text.startswith(("|", "#", "<!--", ":::", "--8<--", "---")):
            close()
            continue
        if re.match(r"([-*+]|\d+\.)\s", text):
            close()
        current.append(text)
    close()
    return blocks


def code_lines(markdown: str) -> list[str]:
    lines, fenced = [], False
    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line)
    return lines


def test_the_paragraph_reader_splits_paragraphs_and_items_and_skips_code():
    page = "One two three.\nfour five.\n\n- an item\n- another\n  continued\n\n```\nnot prose\n```\n| a | b |\n"
    assert paragraphs(page) == ["One two three. four five.", "- an item", "- another continued"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_paragraph_runs_over_60_words(page):
    text = page.read_text(encoding="utf-8")
    long = [(len(b.split()), b[:70]) for b in paragraphs(text) if len(b.split()) > MAX_WORDS]
    assert not long, f"{page.name}: paragraphs over {MAX_WORDS} words (split them, or make a table): {long}"


def test_the_readme_table_cells_stay_short():
    long = []
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            long += [cell.strip()[:60] for cell in line.strip("|").split(" | ") if len(cell.split()) > MAX_CELL_WORDS]
    assert not long, f"README table cells over {MAX_CELL_WORDS} words: {long}"


def _code_wraps() -> bool:
    """Whether the site's stylesheet wraps code blocks (then no line is clipped, whatever its length)."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = config.split("extra_css:", 1)[1] if "extra_css:" in config else ""
    sheets = re.findall(r"^\s+- (\S+\.css)", listed, flags=re.M)
    for sheet in sheets:
        css = (ROOT / "docs" / sheet).read_text(encoding="utf-8")
        rule = re.search(r"\.md-typeset pre > code\s*\{([^}]*)\}", css)
        if rule and "white-space: pre-wrap" in rule.group(1):
            return True
    return False


@pytest.mark.parametrize("page", [*PAGES, ROOT / "docs" / "benchmarks.md"], ids=lambda p: p.name)
def test_no_code_line_is_clipped_at_1280_px(page):
    if _code_wraps():
        return  # wrapped lines are never clipped; the check below is what holds without the stylesheet
    wide = [line for line in code_lines(page.read_text(encoding="utf-8")) if len(line) > CODE_COLUMN_CHARS]
    assert not wide, f"{page.name}: code lines wider than {CODE_COLUMN_CHARS} characters would be clipped: {wide[:3]}"


def test_the_site_wraps_code_blocks():
    assert _code_wraps(), "docs/stylesheets/extra.css must wrap `.md-typeset pre > code` (white-space: pre-wrap)"


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md", "docs/tutorial.md"])
def test_the_set_up_line_comes_before_the_first_vitlab_command(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    first_command = min(i for i in (text.find("\nvitlab "), text.find("`vitlab ")) if i >= 0)
    assert 0 <= text.find("source .venv/bin/activate") < first_command, page
    assert ".venv/bin/vitlab" in text
