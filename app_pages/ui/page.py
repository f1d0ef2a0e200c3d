"""Every page declared once, with its section of the sidebar, the question it answers and the model it needs
(``PAGES``), and ``start``, the one helper that opens each page: the sidebar's settings, the page's title and its
question, the model it needs checked (a sentence and the run ends otherwise), and the note a cold server shows over
its first form (``note_first``)."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app_pages.results.later import note_pending
from app_pages.results.messages import stop_with
from app_pages.results.models import DECODERS, ModelRef
from app_pages.results.threads import here
from models import EMBEDDING, VOCABULARY, HeadLensError
from models.compiled import vocab_words
from models.run import patching_stack, stack_of

from .models import model_for
from .settings import Settings, settings

SECTIONS = ("Looking at attention", "What heads are", "What they cause", "Making models")
ANY, ONE_STACK, EDITABLE, DECODER = "any", "one stack", "editable", "decoder"  # what a page needs of the model
PATCHABLE = "patchable"


@dataclass(frozen=True)
class Page:
    """A page: its file ``app_pages/NAME.py`` and address ``/NAME``, title, icon, sidebar section, the question it
    answers (its first line), what it needs of the model (``ANY``; ``ONE_STACK``: not an encoder-decoder;
    ``EDITABLE``: runs that take edits, head masks and pruning; ``DECODER``: a language model; ``PATCHABLE``: a
    language model or an encoder on the from-scratch engine, patched and measured) and ``why`` (what it
    reads that another model lacks, ``{model}`` its name), and the note over its first form on a cold server."""

    name: str
    title: str
    icon: str
    section: str
    question: str
    needs: str = ANY
    why: str = ""
    first: str = ""
    settings: bool = True       # reads the sidebar's settings (sentences and model); Train needs neither
    language: str = ""          # what it reads of English, which a compiled program's tokens are not; "" if nothing

    @property
    def file(self) -> str:
        return f"app_pages/{self.name}.py"


LOOK, ARE, CAUSE, MAKE = SECTIONS
PAGES = (
    Page("explore", "Explore", ":material/grid_view:", LOOK,
         "What does each head of a layer look at in your sentence?"),
    Page("compare", "Compare", ":material/compare:", LOOK,
         "How do two heads, two sentences or two models differ on the same colour scale?"),
    Page("overview", "Overview", ":material/apps:", LOOK, "What does every head of the model look like at once?"),
    Page("tokens", "Tokens", ":material/share:", LOOK, "Which keys does each token attend to, drawn as lines?"),
    Page("text", "Text", ":material/format_color_text:", LOOK, "Which words receive the most attention?"),
    Page("layers", "Across layers", ":material/stacks:", LOOK,
         "Which input tokens reach a position once the layers have mixed them?"),
    Page("foci", "Foci", ":material/center_focus_strong:", ARE,
         "Which head looks at the sentence type, the objects, the relation, the sentiment?",
         language="the foci of English sentences (their objects, relation, type and sentiment)"),
    Page("roles", "Head roles", ":material/category:", ARE, "What does each head do, over many sentences?",
         language="the built-in corpus of English sentences and their parse"),
    Page("head", "Head", ":material/badge:", ARE,
         "What does one head attend to, what does it do, and does it matter?", ONE_STACK,
         "A head's card reads an encoder or a decoder",
         "A first card: what the server has prepared so far. The rest is being prepared for every session and joins "
         "the card here when it is ready."),
    Page("atlas", "Atlas", ":material/bubble_chart:", ARE, "How do all the heads of a model compare, side by side?",
         ONE_STACK, "The atlas reads an encoder or a decoder",
         "A first atlas: the measures the server has prepared so far. The rest are being prepared for every session "
         "and join it here when they are ready.", language="every head's card, read on the built-in corpus"),
    Page("queries_keys", "Queries & keys", ":material/scatter_plot:", ARE,
         "How does a head match queries to keys, across a whole corpus?", EDITABLE,
         "Queries and keys are read inside HeadLens's own attention, the from-scratch engine",
         language="the built-in corpus"),
    Page("effects", "Effects", ":material/science:", CAUSE, "Which heads make this prediction?", PATCHABLE,
         "Effects are measured inside HeadLens's own attention, the from-scratch engine"),
    Page("circuits", "Circuits", ":material/account_tree:", CAUSE,
         "Which connections between heads carry a task, and do they alone keep it?", PATCHABLE,
         "Circuits run inside HeadLens's own attention, the from-scratch engine"),
    Page("pruning", "Pruning", ":material/content_cut:", CAUSE, "Which heads matter, and how many can go?", EDITABLE,
         "Pruning runs on the from-scratch engine, which switches heads off and cuts them out of the weights",
         language="the built-in corpus's sentences, and each head's role over them"),
    Page("generate", "Generate", ":material/edit_note:", MAKE,
         "What does a decoder write next, and what did it look at?", DECODER,
         "Generation is for decoders, and {model} is not one"),
    Page("train", "Train", ":material/model_training:", MAKE,
         "How do previous-token and induction heads form while a small decoder learns?", settings=False),
)
PAGE = {page.name: page for page in PAGES}
HOME = "explore"  # served at "/" too


def start(name: str, *, s: Settings | None = None, title: str | None = None) -> tuple[Settings, ModelRef]:
    """Open page ``name``: the sidebar's settings (``s`` when the page read them already), its title (``title``, or
    the table's) and question, and the model it needs: ``(settings, the model the page reads)`` (for ``EDITABLE``
    and ``DECODER``, the sidebar's model as the analyses run it). A model the page cannot read gets a sentence saying
    which to choose, and the run ends; a page that reads no settings gets ``(None, None)``."""
    page = PAGE[name]
    s = settings() if s is None and page.settings else s
    st.title(title or page.title)
    st.caption(page.question)
    here.first_note = page.first
    if s is not None and page.language and s.model.program is not None:
        p = s.model.program
        st.info(f"{page.title} reads {page.language}; {s.model.title} reads its own tokens ({vocab_words(p.vocab)}, "
                f"at most {p.max_seq_len}) and computes {p.about}. Its heads are on Explore, Compare and the other "
                "pages that read the sidebar's inputs, and what they cause on Effects and Circuits.")
        st.stop()
    return s, None if s is None else needed(page, s.model)


def needed(page: Page, ref: ModelRef) -> ModelRef:
    """``ref`` as ``page`` reads it, or the run ends with a sentence."""
    why = page.why.format(model=ref.title)
    if page.needs == ONE_STACK and model_for(ref).encoder_decoder:
        st.info(f"{why}; {ref.title} has both. Open its heads on Explore or Compare, or choose another model in the "
                "sidebar.")
        st.stop()
    if page.needs == EDITABLE:
        editable = ref.editable()
        if editable is None:
            st.info(f"{why}. The sidebar's model, {ref.title}, is on the transformers engine: choose a bundled model, "
                    "the untrained encoder, or the custom model on the from-scratch engine there.")
            st.stop()
        return editable
    if page.needs == DECODER:
        return decoder_or_stop(ref, why)
    if page.needs == PATCHABLE:
        analysed = ref.analysed
        try:
            patching_stack(model_for(analysed), why)
        except HeadLensError as err:
            stop_with(err)
        return analysed
    return ref


def decoder_or_stop(ref: ModelRef, why: str) -> ModelRef:
    """``ref`` as the analyses run it when its model offers a vocabulary to write into (``models.offers``: a
    language model's next token); else ``why`` (what the page needs that the model lacks) and which models to
    choose, and the run ends."""
    analysed = ref.analysed
    try:
        stack = stack_of(model_for(analysed), why)
    except HeadLensError as err:  # an architecture the from-scratch engine does not implement: its own sentence
        stop_with(err)
    if VOCABULARY in stack.offers:
        return analysed
    kind = "a compiled program" if ref.program is not None else "an encoder" if EMBEDDING in stack.offers else \
        "a classifier"
    st.info(f"{why}: it is {kind}, with no next token to predict. Choose a bundled decoder ({DECODERS}) in the "
            "sidebar, or a decoder you trained on the Train page.")
    st.stop()


def note_first() -> None:
    """The page's note over what it shows first (``Page.first``), when a cold server left parts of it for later."""
    note_pending(getattr(here, "first_note", ""))
