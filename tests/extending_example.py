"""docs/extending.md's example algorithm as a module: the doc's fenced python block that starts with
`# myalgo.py` is executed here, so the tests run the code the doc shows (it cannot rot), and actor processes
and Ray workers import it by this module's name to unpickle its acting policy."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def example_source() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if b.startswith("# myalgo.py\n")]
    if len(found) != 1:
        raise RuntimeError(f"{DOC} must have one ```python block starting with '# myalgo.py', found {len(found)}")
    return found[0]


exec(compile(example_source(), str(DOC), "exec", dont_inherit=True), globals())   # defines TwinQ, EpsilonGreedy...; registers "twinq"
