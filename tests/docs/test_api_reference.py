"""The API reference (docs/reference/api.md, mkdocstrings) renders its pages' modules in one docstring style:
Markdown code spans and fenced blocks, no raw reST (``:class:`…```, a ``::`` literal block) showing."""

from __future__ import annotations

import re

from tests import readme

# the modules of the API page whose docstrings issue 42 rewrote (the others follow as they are edited)
MODULES = ("api.py", "__init__.py", "runner/recipe.py", "runner/config.py", "runner/plan.py", "fl/plan.py")
REST = re.compile(r":(?:class|func|mod|meth|data|attr|exc|obj):`|::\s*$", re.M)


def test_the_api_pages_modules_show_no_raw_rest():
    page = (readme.ROOT / "docs" / "reference" / "api.md").read_text()
    assert "::: silofl.api" in page and "::: silofl.runner.recipe" in page
    src = readme.ROOT / "src" / "silofl"
    for name in MODULES:
        text = (src / name).read_text()
        hits = [m.group(0) for m in REST.finditer(text)]
        assert not hits, (name, hits[:5])
