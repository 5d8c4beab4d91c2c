"""Every relative link and anchor in README.md and docs/ resolves (issue 60): a file that moved or a heading that
was renamed fails here, naming the page, the line and the link."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"[`*_]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = CODE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        s = _slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _broken(pages: list[Path], root: Path) -> list[str]:
    """Every relative link or anchor of ``pages`` that does not resolve, as ``page:line: target (why)``."""
    broken = []
    for page in pages:
        masked = CODE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text())  # code blocks are examples
        for lineno, line in enumerate(masked.splitlines(), 1):
            for m in LINK.finditer(line):
                target = m.group(1) or m.group(2)
                if re.match(r"^[a-z]+:", target) or target.startswith("//"):
                    continue  # http(s), mailto: not checked here (no network in tests)
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(root)}:{lineno}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_and_anchor_resolves():
    broken = _broken(_pages(), REPO)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_checker_catches_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# The `--tools` flag: live, offline\n\n## Title here\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#title-here) [ok2](docs/a.md#the---tools-flag-live-offline) ![img](docs/a.md)\n"
        "[gone](docs/b.md) [no heading](docs/a.md#nope) [web](https://example.com/x)\n"
        "```\n[inside code](docs/none.md)\n```\n")
    assert _broken([tmp_path / "README.md"], tmp_path) == [
        "README.md:2: docs/b.md (no such file)", "README.md:2: docs/a.md#nope (no such heading)"]
