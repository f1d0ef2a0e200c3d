"""HeadLens: routing and the shared sidebar. Each page lives in app_pages/."""
import streamlit as st

from app_pages.results.later import complete, page_begins
from app_pages.results.preparing import SESSIONS
from app_pages.results.threads import share_the_lock
from app_pages.ui.janitor import janitor
from app_pages.ui.sidebar import sidebar

st.set_page_config(page_title="HeadLens", page_icon=":material/visibility:", layout="wide")
share_the_lock()  # the sessions' torch work takes the interpreter lock back quickly beside others' Python

EXPLORE = "app_pages/explore.py"
PAGES = [
    st.Page(EXPLORE, title="Explore", icon=":material/grid_view:", url_path="home", default=True),
    st.Page("app_pages/foci.py", title="Foci", icon=":material/center_focus_strong:", url_path="foci"),
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare:", url_path="compare"),
    st.Page("app_pages/overview.py", title="Overview", icon=":material/apps:", url_path="overview"),
    st.Page("app_pages/tokens.py", title="Tokens", icon=":material/share:", url_path="tokens"),
    st.Page("app_pages/text.py", title="Text", icon=":material/format_color_text:", url_path="text"),
    st.Page("app_pages/generate.py", title="Generate", icon=":material/edit_note:", url_path="generate"),
    st.Page("app_pages/roles.py", title="Head roles", icon=":material/category:", url_path="roles"),
    st.Page("app_pages/effects.py", title="Effects", icon=":material/science:", url_path="effects"),
    st.Page("app_pages/circuits.py", title="Circuits", icon=":material/account_tree:", url_path="circuits"),
    st.Page("app_pages/queries_keys.py", title="Queries & keys", icon=":material/scatter_plot:", url_path="queries_keys"),
    st.Page("app_pages/head.py", title="Head", icon=":material/badge:", url_path="head"),
    st.Page("app_pages/atlas.py", title="Atlas", icon=":material/bubble_chart:", url_path="atlas"),
    st.Page("app_pages/layers.py", title="Across layers", icon=":material/stacks:", url_path="layers"),
    st.Page("app_pages/pruning.py", title="Pruning", icon=":material/content_cut:", url_path="pruning"),
    st.Page("app_pages/train.py", title="Train", icon=":material/model_training:", url_path="train"),
    # The default page is served at "/" only; this hidden copy answers Explore's own address.
    st.Page(EXPLORE, title="Explore", icon=":material/grid_view:", url_path="explore", visibility="hidden"),
]

page_begins()
page = st.navigation(PAGES, expanded=True)  # every page in the sidebar, not ten and "View more"
if "_open_page" in st.session_state:  # asked for by a page (ui.state.open_page)
    st.switch_page(st.session_state.pop("_open_page"))
janitor()  # drops what only closed sessions held
st.sidebar.title("HeadLens")
with SESSIONS.counted("computing"):  # the server's preparation pauses at its next progress point while a page runs
    sidebar()
    page.run()
complete()  # the full forms of what the page showed first, then the page again with them
