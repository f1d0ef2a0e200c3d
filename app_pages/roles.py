"""Head roles: what each head does, measured over many sentences, with the numbers behind each label."""
import numpy as np
import pandas as pd
import streamlit as st

from analysis import THRESHOLDS, label_measure, make_view
from app_pages.ui.caches import attention
from app_pages.ui.exports import chart, exports
from app_pages.ui.messages import plain, sentences_of, stop_with
from app_pages.ui.profiles import CORPUS, profile
from app_pages.ui.settings import DEFAULT_TEXT, settings
from app_pages.ui.state import bound, choose
from viz import head_heatmap, role_grid, text_shading

UPLOAD_LIMIT = 1_000_000  # bytes
SEED = DEFAULT_TEXT  # the coffee-or-tea sentence, first of the examples
SOURCES = {"corpus": f"Built-in corpus ({len(CORPUS)} sentences)", "sidebar": "The sidebar's sentences",
           "upload": "An uploaded .txt"}


def uploaded_sentences() -> list[str]:
    file = st.file_uploader("A .txt file, one sentence per line", type=["txt"], max_upload_size=1)
    if file is None:
        st.info("Upload a text file to profile its sentences.")
        st.stop()
    data = file.getvalue()
    if len(data) > UPLOAD_LIMIT:
        stop_with(ValueError(f"That file has {len(data):,} bytes; the limit is {UPLOAD_LIMIT:,}."))
    if b"\x00" in data:
        stop_with(ValueError("That file is binary, not text; upload a .txt with one sentence per line."))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        stop_with(ValueError("That file is not UTF-8 text; save it as UTF-8 and upload it again."))
    lines = sentences_of(text)
    if not lines:
        stop_with(ValueError("That file has no sentences in it."))
    return lines[:2000]


s = settings()
st.title("Head roles")
source = bound(st.segmented_control, "corpus", "corpus", init="default", options=list(SOURCES), cast=str,
                 label="Sentences to profile", format_func=SOURCES.get, required=True)
sentences = CORPUS if source == "corpus" else s.sentences if source == "sidebar" else uploaded_sentences()

frame, per_sentence, attentions = profile(s, sentences)

scores = ["prev_token", "next_token", "self", "cls", "sep", "punct", "sentence_type", "entropy_norm", "noun", "verb",
          "modifier", "relation_acc"]
hover = [f"<b>{r.label}</b><br>" + "<br>".join(
    f"{k}: {r[k]:.2f}" for k in ("prev_token", "next_token", "cls", "sep", "punct", "entropy_norm", "noun", "verb"))
    + (f"<br>{r.relation}: {r.relation_acc:.2f} (offset baseline {r.relation_base:.2f})" if r.relation else "")
    for _, r in frame.iterrows()]
grid = role_grid(frame["layer"].to_numpy(), frame["head"].to_numpy(), frame["label"].tolist(), hover,
                 title=f"Roles over {len(attentions)} sentences")
chart(grid, "roles-grid")
st.caption(f"Labels: positional above {THRESHOLDS['positional']}, special tokens and punctuation above "
           f"{THRESHOLDS['special']}, a word class with half the mass and twice its uniform share, syntax at "
           f"{THRESHOLDS['syntax_acc']} accuracy and {THRESHOLDS['syntax_margin']} over the fixed-offset baseline, "
           f"broad above {THRESHOLDS['broad']} of the largest possible entropy; else mixed.")

st.subheader("Every head")
table = frame[["layer", "head", "label", *scores, "relation", "relation_base"]]
st.dataframe(table.style.format(precision=2), hide_index=True, key="roles-table")
st.download_button("Profile · CSV", lambda: table.to_csv(index=False), "headlens-roles.csv", "text/csv",
                   key="roles-csv", on_click="ignore")
exports("roles", grid, None, sig=f"{len(attentions)}|{s}")

st.subheader("Heads by role")
counts = frame["label"].value_counts()
role = choose("Role", list(counts.index), "role", cast=str, format_func=lambda r: f"{r} ({counts[r]} heads)")
measure, higher = label_measure(role)
members = frame[frame["label"] == role].sort_values(measure, ascending=not higher)
st.caption(f"Ranked by {measure} ({'highest' if higher else 'lowest'} first).")
st.dataframe(members[["layer", "head", measure, "relation", "relation_acc", "relation_base"]].style.format(precision=2),
             hide_index=True, key="roles-members")
picks = [f"{r.layer}.{r.head}" for r in members.itertuples()]
pick = choose("Head", picks, "role_head", cast=str, format_func=lambda p: f"layer {p.replace('.', ', head ')}")
layer, head = map(int, pick.split("."))

values = per_sentence[measure][:, layer, head]
order = np.argsort(np.where(np.isnan(values), -np.inf if higher else np.inf, values))
order = order[::-1] if higher else order
st.markdown(f"**Where layer {layer}, head {head} is strongest**")
for tab, i in zip(st.tabs([f"{measure} {values[i]:.2f}" for i in order[:3]]), order[:3]):
    with tab:
        st.caption(plain(attentions[i].text))  # a typed or uploaded sentence: shown literally
        v = make_view(attentions[i], hide_special=s.hide_special, merge_words=s.merge_words)
        fig = head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, height=460,
                           title=f"Layer {layer}, head {head} · {measure} {values[i]:.2f}")
        chart(fig, f"roles-example-{i}")

seed = attention(s, SEED)
sv = make_view(seed, hide_special=s.hide_special, merge_words=s.merge_words)
received = sv.head(layer, head).mean(axis=0)
chart(text_shading(sv.key_labels, received,
                     title=f"What layer {layer}, head {head} looks at, on average over the queries"), "roles-seed")
st.dataframe(pd.DataFrame({"token": sv.key_labels, "attention received": received}).style.format(precision=3),
             hide_index=True, key="roles-seed-table")

st.subheader(f"Heads that behave like layer {layer}, head {head}")
similarity = per_sentence["similarity"]
n_heads = int(frame["head"].max()) + 1
nearest = [i for i in np.argsort(similarity[layer * n_heads + head]) if i != layer * n_heads + head][:6]
st.dataframe(pd.DataFrame({
    "layer": [i // n_heads for i in nearest], "head": [i % n_heads for i in nearest],
    "label": [frame["label"].iloc[i] for i in nearest],
    "Jensen-Shannon divergence (nats)": [similarity[layer * n_heads + head, i] for i in nearest],
}).style.format(precision=3), hide_index=True, key="roles-similar")
st.caption("0 means the same pattern on every sentence; ln 2 = 0.69 means the two never look at the same tokens. "
           "Averaged over the query rows of the first 100 sentences.")
