"""docs/extending.md's example algorithms as a module: the doc's fenced python blocks that start with
`# myalgo.py` (off-policy) and `# reinforce.py` (on-policy) are executed here, so the tests run the code the doc shows (it cannot rot), and actor processes
and Ray workers import it by this module's name to unpickle its acting policy."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def example_source(name: str = "myalgo.py") -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if b.startswith(f"# {name}\n")]
    if len(found) != 1:
        raise RuntimeError(f"{DOC} must have one ```python block starting with '# {name}', found {len(found)}")
    return found[0]


exec(compile(example_source(), str(DOC), "exec", dont_inherit=True), globals())   # defines TwinQ, EpsilonGreedy...; registers "twinq"
# the on-policy example: defines Reinforce, SoftmaxPolicy...; registers "reinforce"
exec(compile(example_source("reinforce.py"), str(DOC), "exec", dont_inherit=True), globals())
