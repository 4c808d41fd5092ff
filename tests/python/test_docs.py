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
