"""The README and docs/ link to each other: every relative link points to a file of the
repository that exists, and every #anchor to a heading of that file (GitHub's anchors); the
README's Python example type-checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)


def _prose(path: Path) -> str:
    """The page without its fenced code blocks and inline code (links there are not links)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of a page (a repeated one gets -1, -2, ...)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        found.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return found


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(path))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not ours


def test_the_slugs_are_githubs():
    assert _slug("Can I trust this judge?") == "can-i-trust-this-judge"
    assert _slug("Measuring a judge: `scripts/judge_sanity.py`") == "measuring-a-judge-scriptsjudge_sanitypy"
    assert _slug("On a GPU workstation: vLLM") == "on-a-gpu-workstation-vllm"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [gone](#nowhere) `[code](#not-a-link)`\n\n"
                    "```\n[also code](#not-either)\n```\n", encoding="utf-8")
    assert links(page) == ["#top", "#nowhere"]
    assert anchors(page) == {"top"}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
            broken.append(f"{target}: no heading #{anchor} in {path.name}")
    assert not broken, f"{page.name}:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    reached, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for target in links(page):
            path = (page.parent / target.partition("#")[0]).resolve()
            if path.suffix == ".md" and path.exists() and path not in reached:
                reached.add(path)
                todo.append(path)
    unreached = {path.name for path in (ROOT / "docs").glob("*.md")} - {path.name for path in reached}
    assert not unreached, sorted(unreached)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_links_or_names_a_path_outside_the_repository(page):
    assert [t for t in LINK.findall(_prose(page)) if re.match(r"[a-z][a-z0-9+.-]*:", t)] == []
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    named = re.findall(r"`(\.\.?/[^`\s]+)`", text)  # a path in inline code, as `../x/Y.md`
    assert [p for p in named if not (page.parent / p).resolve().is_relative_to(ROOT)] == []


def test_the_readmes_python_example_type_checks(tmp_path):
    """mypy --strict (pyproject.toml's settings, and its cache: CI's mypy step has checked
    grader/ just before, so only the example is new) on the README's Python block."""
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"),
                        flags=re.M | re.S)
    assert len(blocks) == 1
    # vLLM's engine process imports the script again: the grading code is under the guard
    assert '\nif __name__ == "__main__":' in blocks[0]
    example = tmp_path / "readme_example.py"
    example.write_text(blocks[0], encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml",
                           str(example)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ci_runs_the_readmes_test_command():
    """`.ci/run` runs the tests as the README tells a user to: the same command, not another."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [command] = [line.split("#")[0].strip() for line in readme.splitlines()
                 if line.rstrip().endswith("# run the tests")]
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
