"""The snippets in docs/python.md run as written (against the test cluster)."""

from __future__ import annotations

import re

import pytest

from conftest import REPO

DOC = REPO / "docs" / "python.md"


def python_blocks(text: str):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.skipif(not DOC.exists(), reason="docs/python.md not in this checkout")
def test_readme_snippet_stores_and_reads_a_tensor(master):
    pytest.importorskip("torch")
    text = DOC.read_text()
    marker = text.index("<!-- snippet: readme")
    code = python_blocks(text[marker:])[0]
    assert "from kvpool.mooncake import MooncakeDistributedStore" in code
    exec(compile(code.replace("127.0.0.1:50051", master), str(DOC), "exec"), {})


@pytest.mark.skipif(not DOC.exists(), reason="docs/python.md not in this checkout")
def test_pythonic_snippet(master, capsys):
    text = DOC.read_text()
    code = [b for b in python_blocks(text) if "kvpool.Client(" in b][0]
    exec(compile(code.replace("127.0.0.1:50051", master), str(DOC), "exec"), {})
    assert "-704 OBJECT_NOT_FOUND" in capsys.readouterr().out
