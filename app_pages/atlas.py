"""Atlas: every head of a model as a point on two of its measures, or on a map of them all; a click opens its card."""
import streamlit as st

from analysis import EXPLAINED, EXPLAINED_LIFT
from analysis.cards.atlas import METRICS, atlas_frame, head_map, metrics_of
from app_pages.results.card import atlas, card_parts, importance_first
from app_pages.results.models import ModelRef, offers_of
from app_pages.ui.card import same_kind
from app_pages.ui.card_links import click_picks_head
from app_pages.ui.exports import chart
from app_pages.ui.page import note_first, start
from app_pages.ui.state import bound, choose, flag
from models import DETECTOR
from models.catalog import CATALOG, bundled
from viz.atlas import atlas_scatter

PLOTS = {"measures": "Two measures", "map": "A map of them all"}
NONE = "none"

s, ref = start("atlas")
st.caption("Every head of the model as one point, placed by the measures its card reports (over the built-in corpus, "
           "the built-in pairs and the task, and for a decoder the head detector); a click on a point opens its "
           "card.")
frames = {ref.title: (ref, atlas_frame(card_parts(ref, s.causal, s.heads_off, importance_too=importance_first(ref), qk_too=False,
                                                 first=True)))}
note_first()  # on a cold server
others = [b for b in CATALOG if bundled(ref.choice) is None or b.key != bundled(ref.choice).key]
if others and bound(st.toggle, "atlas_beside", False, cast=flag, label="Beside another bundled model",
                    help="The other model's heads placed by the same measures, its points beside these (the first "
                         "time it is computed: its model loads and its corpus is read)."):
    kinds = same_kind(ref)
    keys = [b.key for b in others]
    other = choose("Model", keys, "atlas_model", default=kinds[0] if kinds else keys[0], cast=str,
                   format_func=lambda k: bundled(k).title)
    frames[bundled(other).title] = (ModelRef(other, device=ref.device), atlas(ModelRef(other, device=ref.device)))
shared_metrics = [m for m in METRICS if all(m in metrics_of(f) for _, f in frames.values())]
cols = st.columns(2)
plot = bound(cols[0].segmented_control, "atlas_plot", "measures", init="default", options=list(PLOTS), cast=str,
             label="Place heads by", format_func=PLOTS.get, required=True)
roles = ["role", *(c for c in ("detector_role", "rule_family") if all(c in f for _, f in frames.values()))]
colour = choose("Colour", roles, "atlas_colour", default="detector_role" if "detector_role" in roles else "role",
                container=cols[1], cast=str, format_func={"role": "Head roles' label", "detector_role": "Head "
                                                          "detector's label", "rule_family": "Its program's family"}.get)
least = 0.0
if all("explained" in f for _, f in frames.values()):
    least = bound(st.slider, "atlas_explained", 0.0, cast=float, label="Explained from", min_value=0.0, max_value=1.0,
                  step=0.05, help="Only the heads whose program's held-out score is at least this (a head is called "
                  f"explained from {EXPLAINED} with a lift of {EXPLAINED_LIFT:g} over uniform attention).")
    frames = {t: (r, f[f["explained"] >= least]) for t, (r, f) in frames.items()}
cols = st.columns(3)
if plot == "measures":
    default_x = "induction" if "induction" in shared_metrics else "entropy"
    x = choose("Across", shared_metrics, "atlas_x", default=default_x, container=cols[0], cast=str,
               format_func=METRICS.get)
    y = choose("Up", shared_metrics, "atlas_y", default="distance" if x != "distance" else "entropy",
               container=cols[1], cast=str, format_func=METRICS.get)
sizes = [NONE, *(c for c in ("effect", "importance") if c in shared_metrics)]
size = choose("Size", sizes, "atlas_size", default=sizes[-1] if "effect" not in sizes else "effect", cast=str,
              container=cols[2],
              format_func=lambda c: "the same for every head" if c == NONE else f"|{c}|")

for col, (title, (r, frame)) in zip(st.columns(len(frames)), frames.items()):
    with col:
        if len(frame) < 2:
            st.info(f"{title}: {len(frame)} head explained from {least:.2f}; lower “Explained from” to see more.")
            continue
        if plot == "map":
            frame = head_map(frame, shared_metrics)
            share = sum(frame.attrs["explained"])
            x, y = "x", "y"
            labels = {"x": "map, first axis", "y": "map, second axis"}
        else:
            labels = METRICS
        effect = frame.attrs.get("effect", "effect")
        fig = atlas_scatter(frame, x, y, colour=colour, size=None if size == NONE else size,
                            labels={**labels, "effect": effect},
                            title=f"{title} · {len(frame)} heads", title_chars=38 if len(frames) > 1 else 64)
        key = f"atlas-{r.choice}"
        event = chart(fig, key, on_select="rerun", selection_mode="points")
        click_picks_head(event, key, fig, None, choice=r.choice)
        if plot == "map":
            st.caption(f"The first two principal components of every measure (z-scored), keeping {share:.0%} of their "
                       "variance: heads close on the map are alike on most measures.")
if size != NONE:
    st.caption(f"Size: |{size}|" + (f", {next(iter(frames.values()))[1].attrs.get('effect', '')}" if size == "effect"
                                     else "") + ".")
tables = bound(st.toggle, "atlas_table", False, cast=flag, label="Every head's measures as a table")
for col, (title, (r, frame)) in zip(st.columns(len(frames) + 1), frames.items()):
    col.download_button(f"{title} · CSV", lambda f=frame: f.to_csv(index=False), f"headlens-atlas-{r.choice}.csv",
                        "text/csv", key=f"atlas-csv-{r.choice}", on_click="ignore")
    if tables:
        st.dataframe(frame.style.format(precision=3), hide_index=True, key=f"atlas-table-{r.choice}")
if DETECTOR not in offers_of(ref):
    st.caption("An encoder's heads are placed by what they attend to and their effect on its first task (the seed "
               "sentence's objects changed, measured on its sentence embedding); a bundled decoder adds the head "
               "detector, OV copying, what each head writes and its importance.")
