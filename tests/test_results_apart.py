"""What the app computes lives apart from what it draws: every ``@shared`` declaration is in ``app_pages.results``,
whose modules import nothing from ``app_pages.ui`` (widgets, views, page state) and no Streamlit outside the
mechanism that shows a wait (``cache``, ``progress``, ``later``), the model cache (``models``), how an error is said (``messages``) and
which session runs (``threads``)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app_pages import results

pytestmark = pytest.mark.fast

RESULTS = Path(results.__file__).parent
STREAMLIT_ALLOWED = {"cache", "progress", "later", "models", "messages", "threads"}  # a wait, the model cache, an error, a session's id


def imported(path: Path) -> set[str]:
    """The modules ``path`` imports, relative ones resolved inside ``app_pages.results``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                out.add(f"app_pages.results.{node.module}" if node.module else "app_pages.results")
            elif node.level == 2:
                out.add(f"app_pages.{node.module}" if node.module else "app_pages")
            else:
                out.add(node.module)
    return out


def declaring(path: Path) -> list[str]:
    """The names of the results ``path`` declares with ``@shared("name", ...)``."""
    return [d.args[0].value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list
            if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "shared" and d.args]


def test_every_declared_result_lives_in_results():
    everywhere = {name: path for path in RESULTS.parent.rglob("*.py") for name in declaring(path)}
    assert {path.parent for path in everywhere.values()} == {RESULTS}
    declared = results.declarations()
    assert {d.name for d in declared} == set(everywhere)
    assert {d.compute.__module__.rsplit(".", 1)[0] for d in declared} == {"app_pages.results"}


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.py")), ids=lambda p: p.stem)
def test_a_results_module_imports_no_widget_module(path):
    found = imported(path)
    assert not {m for m in found if m.startswith("app_pages.ui") or m == "app_pages.ui"}, found
    assert not any(m.startswith("app_pages.") and not m.startswith("app_pages.results") for m in found)
    if path.stem not in STREAMLIT_ALLOWED:
        assert not {m for m in found if m.split(".")[0] == "streamlit"}, found
