"""Head roles for a decoder: the head detector's scores as a grid, and a chosen head on a repeated sequence."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis import DETECTORS, make_view
from analysis.roles.detector import DETECTOR_LABELS, LENGTH, SENTENCES, SEQUENCES, repeated_sequences
from models import DETECTOR, head_label
from models.catalog import CATALOG, bundled
from viz import head_heatmap, role_grid

from ..results.attention import cached_attention
from ..results.detector import detected
from ..results.models import ModelRef, cached_model
from .card_links import click_picks_head
from .exports import chart
from .state import bound, choose, flag, head_from_url, head_to_url

ABOUT = (f"On {SEQUENCES} sequences of {LENGTH} random words repeated twice (Olsson et al. 2022): induction is the "
         "weight a token of the second copy gives the token after its earlier occurrence, duplicate token the weight "
         f"on that occurrence itself; on {SENTENCES} sentences of the built-in corpus, previous token is the weight "
         "on the token just before, sink the weight of the queries after the first on the first token. Each is a "
         "mean with its 95% bootstrap interval; a head is labelled by the first score whose interval lies wholly "
         "above its bar (" + ", ".join(f"{label} {bar}" for label, bar in DETECTOR_LABELS.values()) + "), else other.")
NAMES = {"previous_token": "previous token", "duplicate_token": "duplicate token", "induction": "induction",
         "sink": "sink"}


def show_decoder_heads(ref: ModelRef) -> None:
    """The section of Head roles that a decoder gets: the detector's grid, its table, and a head on a repeated sequence."""
    st.subheader("Decoder heads: induction, duplicate token, previous token, sink")
    df = detected(ref)
    tips = ["<br>".join(f"{NAMES[n]}: {r[n]:.2f} ({r[f'{n}_lo']:.2f}–{r[f'{n}_hi']:.2f})" for n in DETECTORS)
            for _, r in df.iterrows()]
    grid = role_grid(df["layer"].to_numpy(), df["head"].to_numpy(), df["label"].tolist(), tips,
                     title="Decoder heads · repeated random sequences and the built-in corpus")
    click_picks_head(chart(grid, "roles-detector", on_select="rerun", selection_mode="points"), "roles-detector", grid,
                     int(df["head"].max()) + 1)
    st.caption(ABOUT)
    columns = ["layer", "head", "label", *(c for n in DETECTORS for c in (n, f"{n}_lo", f"{n}_hi"))]
    st.dataframe(df[columns].style.format(precision=2), hide_index=True, key="roles-detector-table")
    beside(ref, df)
    st.download_button("Decoder heads · CSV", lambda: df[columns].to_csv(index=False), "headlens-decoder-heads.csv",
                       "text/csv", key="roles-detector-csv", on_click="ignore")
    ranked = df.sort_values("induction", ascending=False)
    picks = list(zip(ranked["layer"].tolist(), ranked["head"].tolist()))
    induction = dict(zip(picks, ranked["induction"].tolist()))
    layer, head = choose("Head on a repeated sequence", picks, "detector_head", cast=head_from_url, to_url=head_to_url,
                         format_func=lambda h: f"{head_label(*h)} · induction {induction[h]:.2f}")
    model = cached_model(ref)
    text = repeated_sequences(model.tokenizer, 1, LENGTH)[0]
    v = make_view(cached_attention(ref, text, False, ()))
    chart(head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, height=760, max_cells=None,
                       visible=v.visible(layer), title=f"{head_label(layer, head)} on a sequence repeated twice"),
          "roles-detector-example")
    st.caption("An induction head lights a diagonal offset by one below the main one in the lower-left square: each "
               "token of the second copy looks at the token that followed it the first time.")


def beside(ref: ModelRef, df: pd.DataFrame) -> None:
    """On request, this decoder's role grid beside another bundled decoder's, with how many heads each role has."""
    others = [b for b in CATALOG if DETECTOR in b.offers and ref.choice not in b.engines()]
    if not others or not bound(st.toggle, "roles_beside", False, cast=flag, label="Beside another bundled decoder",
                               help="The other model's heads detected the same way (about 10 s the first time, "
                                    "then shared), its grid beside this one's."):
        return
    key = choose("Decoder", [b.scratch_key for b in others], "roles_beside_model", cast=str,
                 format_func=lambda k: bundled(k).title)
    refs = [ref, ModelRef(key, device=ref.device)]
    frames = [df, detected(refs[1])]
    titles = [bundled(r.choice).title if bundled(r.choice) else r.title for r in refs]
    for col, r, frame, title in zip(st.columns(2), refs, frames, titles):
        with col:
            L, H = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
            tips = ["<br>".join(f"{NAMES[n]}: {row[n]:.2f}" for n in DETECTORS) for _, row in frame.iterrows()]
            grid = role_grid(frame["layer"].to_numpy(), frame["head"].to_numpy(), frame["label"].tolist(), tips,
                             title=f"{title} · {L} layers × {H} heads", compact=True, title_chars=38)
            key = f"roles-beside-{r.choice}"
            click_picks_head(chart(grid, key, on_select="rerun", selection_mode="points"), key, grid, H, choice=r.choice)
    counts = pd.DataFrame({t: f["label"].value_counts() for t, f in zip(titles, frames)}).fillna(0).astype(int)
    counts.loc["heads"] = [len(f) for f in frames]
    st.dataframe(counts, key="roles-beside-counts")
    st.caption("Heads per role in each model, by the same scores and bars; a role's share of the heads says more than "
               "its count when the models differ in size.")
