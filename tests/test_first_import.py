"""The default page opens without what it does not draw: a fresh process importing what app.py and Explore import
loads no ``scipy.stats`` (a second of a cold server's first page on two cores; the figures that use it import it)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
DEFERRED = ["scipy.stats"]


def imports_of(path: Path) -> list[str]:
    """The modules ``path`` imports at its top level."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return out


def test_the_first_page_imports_no_scipy_stats():
    modules = sorted(set(imports_of(ROOT / "app.py") + imports_of(ROOT / "app_pages" / "explore.py")))
    assert "app_pages.ui.sidebar" in modules and "app_pages.ui.attention" in modules
    script = "; ".join([f"import {m}" for m in modules] + [f"import sys; print([m for m in {DEFERRED!r} if m in sys.modules])"])
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
