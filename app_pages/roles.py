"""Head roles: what each head does, measured over many sentences, with the numbers behind each label."""
import pandas as pd
import streamlit as st

from analysis import FOCI, FOCUS_NAMES, THRESHOLDS, label_measure, make_view
from app_pages.results.models import offers_of
from app_pages.ui.attention import attention
from app_pages.ui.card_links import card_button, click_picks_head
from app_pages.ui.detector import show_decoder_heads
from app_pages.ui.explanations import every_head_explained, explained_now
from app_pages.ui.exports import chart, exports
from app_pages.ui.page import start
from app_pages.ui.profiles import CONTENT_ATTENTION, page_profile, profile_file
from app_pages.ui.roles import similar, strongest_in_document, strongest_sentences
from app_pages.ui.state import choose, head_from_url, head_to_url
from models import DETECTOR, head_label
from models.corpus import DEFAULT_TEXT
from viz import role_grid, text_shading

s, _ = start("roles")
profiled = page_profile(s)
frame = profiled.frame

scores = ["prev_token", "next_token", "self", "cls", "sep", "punct", "final_mark", "entropy_norm",
          *(c for f in FOCI for c in (f"{f}_lift", f"{f}_lift_lo", f"{f}_lift_hi")), "dep_acc"]


def tip(r) -> str:
    foci = "<br>".join(f"{FOCUS_NAMES[f]}: lift {r[f'{f}_lift']:.2f} ({r[f'{f}_lift_lo']:.2f}–{r[f'{f}_lift_hi']:.2f})"
                       for f in FOCI if r[f"{f}_n"] > 0)
    raw = "<br>".join(f"{k}: {r[k]:.2f}" for k in ("prev_token", "next_token", "cls", "sep", "punct", "entropy_norm"))
    syntax = f"<br>{r.dep_relation}: {r.dep_acc:.2f} (offset baseline {r.dep_base:.2f})" if r.dep_relation else ""
    also = f"<br>also: {r.secondary}" if r.secondary else ""
    return f"<b>{r.label}</b>{also}<br>{foci}<br>{raw}{syntax}"


grid = role_grid(frame["layer"].to_numpy(), frame["head"].to_numpy(), frame["label"].tolist(),
                 [tip(r) for _, r in frame.iterrows()], title=f"Roles over {profiled.n_sentences:,} sentences")
click_picks_head(chart(grid, "roles-grid", on_select="rerun", selection_mode="points"), "roles-grid", grid,
                 int(frame["head"].max()) + 1)
counts = ", ".join(f"{FOCUS_NAMES[f]} {int(frame[f'{f}_n'].iloc[0])}" for f in FOCI)
st.caption(f"Labels: positional above {THRESHOLDS['positional']}; a focus when the lower end of its lift's 95% "
           f"interval is {THRESHOLDS['focus_lift_lo']} or more, over at least {THRESHOLDS['focus_sentences']} "
           f"sentences with such a word (sentences with one: {counts}); syntax at {THRESHOLDS['syntax_acc']} "
           f"accuracy and {THRESHOLDS['syntax_margin']} over the fixed-offset baseline; special tokens and "
           f"punctuation above {THRESHOLDS['special']}; broad above {THRESHOLDS['broad']} of the largest possible "
           f"entropy; else mixed. {CONTENT_ATTENTION} Foci are measured on it; the other columns on raw attention.")

st.subheader("Every head")
table = frame[["layer", "head", "label", "secondary", *scores, "dep_relation", "dep_base"]]
# each head's program (below), on the built-in paragraphs once computed; until then on the built-in sentences
explained, coming = explained_now(s.model, s.causal, s.heads_off)
table = table.merge(explained[["layer", "head", "rule", "score"]].rename(columns={"score": "explained"}),
                    on=["layer", "head"], how="left")
st.dataframe(table.style.format(precision=2), hide_index=True, key="roles-table")
left, right, _ = st.columns([1, 1, 2])
left.download_button("Profile · CSV", lambda: table.to_csv(index=False), "headlens-roles.csv", "text/csv",
                     key="roles-csv", on_click="ignore")
if profiled.texts is not None:  # a computed profile saves as a file that "Open a saved profile" takes back
    right.download_button("Profile · Parquet", lambda: profile_file(s, profiled), "headlens-profile.parquet",
                          "application/vnd.apache.parquet", key="roles-parquet", on_click="ignore",
                          help="Every column, with the model and corpus recorded: open it again here, or in pandas.")
exports("roles", grid, None, sig=f"{profiled.n_sentences}|{s}")

st.subheader("Heads by role")
counts = frame["label"].value_counts()
role = choose("Role", list(counts.index), profiled.key("role"), cast=str,
              format_func=lambda r: f"{r} ({counts[r]} heads)")
measure, higher = label_measure(role)
members = frame[frame["label"] == role].sort_values(measure, ascending=not higher)
st.caption(f"Ranked by {measure} ({'highest' if higher else 'lowest'} first).")
extra = [f"{measure}_lo", f"{measure}_hi"] if measure.endswith("_lift") else []
st.dataframe(members[["layer", "head", measure, *extra, "secondary", "dep_relation", "dep_acc"]].style.format(precision=2),
             hide_index=True, key="roles-members")
picks = list(zip(members["layer"].tolist(), members["head"].tolist()))
layer, head = choose("Head", picks, profiled.key("role_head"), cast=head_from_url, to_url=head_to_url,
                     format_func=lambda h: head_label(*h))
name = head_label(layer, head)
card_button(layer, head, "roles-card")

if profiled.attentions is not None:
    strongest_sentences(s, profiled, layer, head, measure, higher)
elif profiled.document is not None:
    strongest_in_document(s, profiled, layer, head, measure, higher)
seed = attention(s, DEFAULT_TEXT)  # the coffee-or-tea sentence
sv = make_view(seed, hide_special=s.hide_special, merge_words=s.merge_words)
received = sv.head(layer, head).mean(axis=0)
chart(text_shading(sv.key_labels, received,
                     title=f"What {name} looks at, on average over the queries"), "roles-seed")
st.dataframe(pd.DataFrame({"token": sv.key_labels, "attention received": received}).style.format(precision=3),
             hide_index=True, key="roles-seed-table")

if profiled.per_sentence is None:
    st.info("A saved profile holds each head's measures, not its sentences: profile sentences here to see where "
            "a head is strongest and which heads behave alike.")
else:
    similar(profiled, layer, head)
if DETECTOR in offers_of(s.model):  # a bundled decoder's detector, prepared
    show_decoder_heads(s.model)
every_head_explained(s.model, s.causal, s.heads_off, explained, coming, s.sentences,
                     lambda text: attention(s, text))
