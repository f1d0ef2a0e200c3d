"""HeadLens's server: ``streamlit run app.py`` serves the pages (``headlens.py``, run for each session) and, as it
starts, loads what the first session would wait for (``app_pages.ui.preload``: the default model unless
``HEADLENS_PRELOAD`` says otherwise); ``/headlens/preload`` says how far that has got."""
import threading
from contextlib import asynccontextmanager

import streamlit as st
from starlette.responses import JSONResponse
from starlette.routing import Route

REPORT: dict = {}  # the preload's progress, written by its thread


def _preload() -> None:
    from app_pages.ui.preload import preload  # imported here: torch and the rest take seconds

    preload(REPORT)


@asynccontextmanager
async def lifespan(_app):
    # a thread of its own: the server answers at once, and a session that asks for the model meanwhile waits for it
    threading.Thread(target=_preload, name="headlens-preload", daemon=True).start()
    yield


async def preloaded(_request):
    return JSONResponse(REPORT)


app = st.App("headlens.py", lifespan=lifespan, routes=[Route("/headlens/preload", preloaded)])
