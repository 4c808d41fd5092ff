"""scripts/mutants.py breaks the code each GPU test guards: every mutant's
text must still be in its file, once, or the mutant cannot be made (a
stale one was found this way)."""
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import mutants  # noqa: E402


@pytest.mark.parametrize("name,path,text", [(m[0], m[1], m[2]) for m in mutants.MUTANTS])
def test_every_mutant_finds_its_text_once(name, path, text):
    with open(os.path.join(ROOT, path)) as f:
        assert f.read().count(text) == 1, f"mutant '{name}': its text is not in {path} once"
