"""The README's Python examples run as written."""
import pathlib
import re
import textwrap

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)^ *```", README.read_text(), flags=re.S | re.M) if README.exists() else []


@pytest.mark.skipif(not BLOCKS, reason="README.md not found next to the tests")
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example(index):
    # an example for an optional framework (an adapter section) skips when it is not installed
    for framework in ("torch", "jax", "dask"):
        if re.search(rf"\b(import|from) {framework}\b|gs3d\.{framework}\b", BLOCKS[index]):
            pytest.importorskip(framework)
    exec(compile(textwrap.dedent(BLOCKS[index]), f"README.md[python block {index}]", "exec"), {})
