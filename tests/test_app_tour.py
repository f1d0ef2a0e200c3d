"""Every page opened after every other page, in one session: what a person clicking around does.

A page's widgets outlive it in the session; a value one page leaves behind (a head picked on Foci,
a layer on Explore) must not break the next. The tour walks every ordered pair of pages once (an
Eulerian circuit of the complete directed graph) on the default text.
"""
from tests.conftest import ROOT

PAGES = sorted(f"app_pages/{p.name}" for p in (ROOT / "app_pages").glob("*.py") if p.name != "__init__.py")

# Foci and Head roles profile the sidebar's sentence and Pruning measures on it: the tour is about
# moving between pages, and the built-in corpus is profiled in their own tests.
LINK = {"corpus": "sidebar", "prune_on": "sidebar", "qk_corpus": "sidebar"}


def tour(pages: list[str]) -> list[str]:
    """Pages in an order that goes from each page to each other page exactly once (Hierholzer)."""
    left = {p: [q for q in pages if q != p] for p in pages}
    stack, walk = [pages[0]], []
    while stack:
        if left[stack[-1]]:
            stack.append(left[stack[-1]].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def test_the_tour_visits_every_ordered_pair_once():
    pages = ["a", "b", "c", "d"]
    walk = tour(pages)
    pairs = list(zip(walk, walk[1:]))
    assert len(pairs) == len(set(pairs)) == 12 and {p for pair in pairs for p in pair} == set(pages)


def test_every_page_opens_after_every_other_page(new_app):
    at = new_app(LINK)
    walk = tour(PAGES)
    seen = set()
    for before, page in zip(walk, walk[1:]):
        at.switch_page(page).run()
        assert not at.exception, (f"{before} -> {page}", at.exception)
        assert not at.error, (f"{before} -> {page}", [e.value for e in at.error])
        assert at.title and at.title[0].value, f"{before} -> {page}: the page drew nothing"
        seen.add((before, page))
    assert len(seen) == len(PAGES) * (len(PAGES) - 1) == 240  # 16 pages
