"""The README and the docs, as a newcomer reads them: every relative link
leads to a file that exists, and every Python block compiles."""
import os
import re
import textwrap

import pytest

from conftest import ROOT


def pages():
    docs = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                  if f.endswith(".md"))
    results = [os.path.join(top, d, "README.md") for top in ("benchmarks/results", "tests/results")
               for d in sorted(os.listdir(os.path.join(ROOT, top)))
               if os.path.isfile(os.path.join(ROOT, top, d, "README.md"))]
    return ["README.md"] + docs + results


@pytest.mark.parametrize("page", pages())
def test_every_link_resolves(page):
    text = open(os.path.join(ROOT, page)).read()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue                                    # a web address, or this page
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target.split("#")[0]))
        if not os.path.exists(path):
            missing.append(target)
    assert not missing, f"{page} links to what is not there: {missing}"


@pytest.mark.parametrize("page", pages())
def test_every_python_block_compiles(page):
    text = open(os.path.join(ROOT, page)).read()
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
        compile(textwrap.dedent(block), f"{page}, Python block {i + 1}", "exec")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: str) -> set:
    text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)   # no headings in code
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", pages())
def test_every_link_to_a_section_finds_it(page):
    text = open(os.path.join(ROOT, page)).read()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or "#" not in target:
            continue
        file, anchor = target.split("#", 1)
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), file)) if file \
            else os.path.join(ROOT, page)
        if path.endswith(".md") and os.path.isfile(path) and anchor not in _anchors(path):
            missing.append(target)
    assert not missing, f"{page} links to sections that are not there: {missing}"


EXAMPLES = os.path.join(ROOT, "examples")
# Pages that are not how-to pages: the index, the words, the reference, the why.
NOT_HOW_TO = {"guide.md", "glossary.md", "api.md", "errors.md", "design.md", "development.md",
              "fsdp2-study.md"}


@pytest.mark.parametrize("page", sorted(f for f in os.listdir(os.path.join(ROOT, "docs"))
                                        if f.endswith(".md") and f not in NOT_HOW_TO))
def test_each_how_to_page_has_a_runnable_example(page):
    text = open(os.path.join(ROOT, "docs", page)).read()
    examples = re.findall(r"\]\(\.\./(examples/[^)\s#]+)\)", text)
    assert examples, f"docs/{page} links no example under examples/"


def test_each_example_is_shown_by_a_page():
    linked = set()
    for page in pages():
        linked |= {os.path.normpath(os.path.join(os.path.dirname(page), t))
                   for t in re.findall(r"\]\(([^)\s#]+)\)", open(os.path.join(ROOT, page)).read())}
    scripts = sorted(f"examples/{f}" for f in os.listdir(EXAMPLES)
                     if f.endswith(".py") and not f.startswith("_") and f != "demo.py")
    unlinked = [s for s in scripts if s not in linked]
    assert not unlinked, f"examples no page of docs/ links: {unlinked}"


@pytest.mark.parametrize("page", ["README.md"] + [os.path.join("docs", f) for f in
                                                  sorted(os.listdir(os.path.join(ROOT, "docs")))
                                                  if f.endswith(".md")])
def test_figures_are_cited_by_date_and_machine_not_by_period_of_work(page):
    text = open(os.path.join(ROOT, page)).read()
    cited = re.findall(r"\bsessions? \d+|\(s\d+\)|-s\d+-|\bsession\d", text, re.I)
    assert not cited, f"{page} cites periods of work: {cited}"


def test_the_glossary_defines_each_word_once():
    rows = [line for line in open(os.path.join(ROOT, "docs", "glossary.md"))
            if line.startswith("| **")]
    words = [row.split("**")[1] for row in rows]
    assert len(words) > 20
    assert len(words) == len(set(words)), \
        f"defined twice: {sorted({w for w in words if words.count(w) > 1})}"


def readme_figures():
    """The rows of the README's figures table, as lists of cells."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def test_each_readme_figure_cites_one_run_that_records_its_machine():
    """At most 8 rows; each row's figures come from one run, whose JSON
    records the machine, torch, CUDA and driver that measured it; ratios are
    shares (higher is better), never multiples."""
    import json
    rows = readme_figures()
    assert 0 < len(rows) <= 8
    for cells in rows:
        runs = re.findall(r"\]\((benchmarks/results/[^)]+)\)", " ".join(cells))
        assert len(runs) == 1 and runs[0].endswith(".json"), \
            f"the row '{cells[0]}' cites {runs}, not one run's JSON"
        machine = json.load(open(os.path.join(ROOT, runs[0]))).get("machine") or {}
        missing = [k for k in ("gpu", "torch", "cuda", "driver") if not machine.get(k)]
        assert not missing, f"{runs[0]} does not record its {missing}"
        assert "×" not in " ".join(cells[1:3]), \
            f"the row '{cells[0]}' writes a ratio as a multiple"


def test_no_cell_of_the_api_reference_passes_60_words():
    text = open(os.path.join(ROOT, "docs", "api.md")).read()
    long = [cell.strip()[:60] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|---")
            for cell in line.strip().strip("|").split(" | ") if len(cell.split()) > 60]
    assert not long, f"api.md cells over 60 words: {long}"


def test_every_results_json_records_the_machine_that_measured_it():
    """Each benchmark's JSON under benchmarks/results names the GPU, driver,
    torch and CUDA of its run (or says it ran without a GPU); traces
    (*_residency.json, profiles) are the runs' raw events, not results."""
    import glob
    import json
    missing = []
    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*", "*.json"))):
        if path.endswith("_residency.json"):
            continue
        machine = json.load(open(path)).get("machine") or {}
        lacks = [k for k in ("gpu", "torch", "cuda", "driver") if not machine.get(k)]
        if lacks:
            missing.append(f"{os.path.relpath(path, ROOT)} lacks {lacks}")
    assert not missing, missing


def test_the_readme_reads_in_five_minutes():
    """At most 1,000 words (five minutes at 200 a minute), no table cell
    past 25 words, and its first lines are the two commands: the demo and
    every test."""
    text = open(os.path.join(ROOT, "README.md")).read()
    assert len(text.split()) <= 1000, f"README.md has {len(text.split())} words"
    cells = [c.strip() for line in text.splitlines()
             if line.startswith("|") and not line.startswith("|---")
             for c in line.strip().strip("|").split(" | ")]
    long = [c[:60] for c in cells if len(c.split()) > 25]
    assert not long, f"README cells over 25 words: {long}"
    first = [line for line in text.splitlines()[1:6] if line.startswith("- **")]
    assert "bash scripts/demo.sh" in first[0] and "bash scripts/test.sh" in first[1], first
