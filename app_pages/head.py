"""Head: everything HeadLens measures of one head, on one card (/head?model=smollm2&head=23.3)."""
import streamlit as st

from analysis.cards.atlas import atlas_frame, heads_like
from analysis.cards.card import card_from, detector_label, repeat_showcase
from app_pages.results.card import card_parts, importance_first, telling
from app_pages.results.models import offers_of
from app_pages.results.detector import detected
from app_pages.results.tasks import first_spec
from app_pages.ui import card_view as view
from app_pages.ui import compiled
from app_pages.ui.card import same_kind, stored_atlas
from app_pages.ui.exports import file_name
from app_pages.ui.models import model_for
from app_pages.ui.page import note_first, start
from app_pages.ui.pickers import pick_sentence
from app_pages.ui.settings import settings
from app_pages.ui.state import choose, head_from_url, head_to_url
from app_pages.ui.why import why_section
from models import DETECTOR, head_label
from models.catalog import bundled
from models.corpus import DEFAULT_TEXT

s = settings()
ref = s.model
model = model_for(ref)
picks = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
top = st.columns([1, 3])
# a card opens on the model's most telling head (its strongest induction or object head), once the detector or the
# profile it is read from is there: a decoder's is prepared, an encoder's takes seconds and the card reads it too
opening = compiled.opening(ref) if ref.program is not None else None if model.encoder_decoder else \
    telling(ref, s.causal, s.heads_off)
layer, head = choose("Head", picks, "head", default=None if opening is None else opening[:2], container=top[0],
                     cast=head_from_url, to_url=head_to_url, format_func=lambda h: head_label(*h))
start("head", s=s, title=f"{head_label(layer, head)} · {ref.title}")
summary = st.container()  # the card in sentences, once its parts are gathered
text = pick_sentence(s, container=top[1], label="Your input" if ref.program is not None else "Your sentence")
if ref.program is not None:  # its card: what the compiler put in the head beside what HeadLens finds
    compiled.head_card(s, ref, layer, head, text)
    st.stop()
# the sidebar's sentence untouched, a decoder's head opens on a text that shows its habit (the founding sentence
# repeats nothing, so an induction head shows only its sink there). The head is drawn before its card is gathered
# over the corpus (seconds to a minute on a cold server) where that text needs no card: the user's own sentence, an
# encoder's head, and a head the detector (which chose the opening head) says shows its habit on a repeat
untouched = (st.session_state.get("text") or DEFAULT_TEXT) == DEFAULT_TEXT
early, shown = DETECTOR not in offers_of(ref) or not untouched, None
if not early:
    shown = repeat_showcase(detector_label(detected(ref), layer, head), text)  # the detector ``telling`` read
    early = shown is not None
if early:
    view.on_text(s, layer, head, text, shown)
# a bundled decoder's importance is prepared (2 s if not yet); every head's queries-and-keys picture (45 s) and an
# encoder's importance (a minute) are shown once computed, on their pages or a button here
with st.spinner("Gathering the head's measures over the built-in corpus…"):
    parts = card_parts(ref, s.causal, s.heads_off, importance_too=importance_first(ref), qk_too=False, first=True)
note_first()  # on a cold server
card = card_from(parts, ref.title, layer, head)
others, choices = {}, {ref.title: ref.choice}
for key in same_kind(ref):
    found = stored_atlas(key, ref.device)
    if found is not None:
        others[bundled(key).title] = found
        choices[bundled(key).title] = key
card.like = heads_like(atlas_frame(parts), layer, head, others, model=ref.title)
summary.markdown(card.summary().replace("*", "\\*"))
missing = [bundled(k).title for k in same_kind(ref) if bundled(k).title not in others]
if not early:
    view.on_text(s, layer, head, text, card.showcase(text))
view.over_corpus(card, len(parts.attentions))
view.explained(card, s, text)
view.examples(card)
view.what_it_writes(s, ref, card, text)
view.predictions(ref, card, text)
why_section(ref, text, layer, head, "why", spec=first_spec(model))
view.queries_keys(ref, card)
view.like_it(card, choices)
if missing:
    st.caption(f"Heads of {', '.join(missing)} join this list once the server has prepared "
               f"{'that model' if len(missing) == 1 else 'those models'} (open {'it' if len(missing) == 1 else 'them'}"
               " once in the sidebar).")
st.download_button("Top examples · CSV", lambda: card.top.to_csv(index=False),
                   file_name((layer, head), "examples", ext="csv"), "text/csv", key="card-csv", on_click="ignore")
