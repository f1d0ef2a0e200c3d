"""HeadLens's pages: routing and the shared sidebar, run for each session (``app.py`` serves it). Each page lives in
app_pages/."""
import streamlit as st

from app_pages.results.later import complete, page_begins
from app_pages.results.preparing import SESSIONS
from app_pages.results.threads import share_the_lock
from app_pages.ui.janitor import janitor
from app_pages.ui.page import HOME, PAGE, PAGES, SECTIONS
from app_pages.ui.sidebar import sidebar

st.set_page_config(page_title="HeadLens", page_icon=":material/visibility:", layout="wide")
share_the_lock()  # the sessions' torch work takes the interpreter lock back quickly beside others' Python


def navigation() -> dict[str, list]:
    """The sidebar's sections, each page in the one table that declares them (``ui.page.PAGES``)."""
    sections = {section: [] for section in SECTIONS}
    for p in PAGES:
        sections[p.section].append(st.Page(p.file, title=p.title, icon=p.icon, url_path="home" if p.name == HOME
                                           else p.name, default=p.name == HOME))
    # The default page is served at "/" only; this hidden copy answers Explore's own address.
    home = PAGE[HOME]
    sections[home.section].append(st.Page(home.file, title=home.title, icon=home.icon, url_path=HOME,
                                          visibility="hidden"))
    return sections


page_begins()
page = st.navigation(navigation(), expanded=True)  # every page in the sidebar, not ten and "View more"
if "_open_page" in st.session_state:  # asked for by a page (ui.state.open_page)
    st.switch_page(st.session_state.pop("_open_page"))
janitor()  # drops what only closed sessions held
st.sidebar.title("HeadLens")
with SESSIONS.counted("computing"):  # the server's preparation pauses at its next progress point while a page runs
    sidebar()
    page.run()
complete()  # the full forms of what the page showed first, then the page again with them
