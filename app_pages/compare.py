"""Compare: one to four (model, sentence, layer, head) picks side by side on one colour scale."""
import streamlit as st

from app_pages.results.models import CUSTOM
from app_pages.ui.attention import attention
from app_pages.ui.card_links import card_button
from app_pages.ui.exports import chart, exports
from app_pages.ui.models import model_for, model_names, ref_for
from app_pages.ui.page import start
from app_pages.ui.pickers import pick_full_resolution, pick_layer, pick_sentence
from app_pages.ui.state import bound, choose
from app_pages.ui.views import causal_note, view
from models import head_label
from viz import head_heatmap

s, _ = start("compare")
n = bound(st.segmented_control, "picks", 2, init="default", options=[1, 2, 3, 4], cast=int, label="Picks",
          required=True)
MODELS = model_names()
choices = [m for m in MODELS if m not in CUSTOM or s.model.folder]
first = s.model.choice if s.model.choice in choices else "minilm"
defaults = [(first, 0), (first, 1), ("untrained", 0), ("scratch" if first != "scratch" else "minilm", 0)]
if first in ("trained", "trained_start"):  # how training changed one head: step 0 beside the last step
    defaults[:2] = [("trained_start", 0), ("trained", 0)]

picks = []
for i, col in enumerate(st.columns(n)):
    with col:
        st.markdown(f"**Pick {i + 1}**")
        model = ref_for(choose("Model", choices, f"p{i + 1}_model", default=defaults[i][0], cast=str,
                               format_func=MODELS.get), s.model.device)
        text = pick_sentence(s, key=f"p{i + 1}_sentence")
        loaded = model_for(model)
        if loaded.encoder_decoder:  # the part picked decides the layers
            att = attention(s, text, model, key=f"p{i + 1}_component")
            layer = pick_layer(att.n_layers, key=f"p{i + 1}_layer", windows=att.windows)
        else:  # each pick computes its own layer only: the from-scratch engine runs none above it
            layer = pick_layer(loaded.n_layers, key=f"p{i + 1}_layer", windows=loaded.windows)
            att = attention(s, text, model, layers=(layer,))
        v = view(s, att)
        head = choose("Head", list(range(att.n_heads)), f"p{i + 1}_head", default=defaults[i][1])
        card_button(layer, head, f"p{i + 1}_card", choice=model.choice)
        picks.append((model, att, v, layer, head))

zmax = max(float(v.head(layer, head).max()) for _, _, v, layer, head in picks) if s.shared_scale else None
# Two to a row: a chart keeps room for its labels even in a narrow window (a 1024 px one gives
# the page 564 px).
for row in range(0, n, 2):
    for col, i in zip(st.columns(min(n, 2)), range(row, min(row + 2, n))):
        model, att, v, layer, head = picks[i]
        with col:
            fig = head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, zmax=zmax, height=460,
                               title_chars=34, visible=v.visible(layer),
                               title=f"{i + 1}: {model.title} · {head_label(layer, head)}")
            chart(fig, f"compare-{i + 1}")
            with st.expander("Downloads"):
                exports(f"compare-{i + 1}", fig, att, v, layer, head, sig=f"{att.text}|{model}|{layer}|{head}|{s}")
causal_note(next((p[2] for p in picks if p[2].causal), picks[0][2]))  # a grey triangle in any pick
readings = {}  # how each tokenizer read the picks' text: picks of other models may split it otherwise
for i, (model, att, v, layer, head) in enumerate(picks, start=1):
    readings.setdefault((att.text, tuple(att.tokens)), []).append((i, model.title, len(att.tokens)))
if len({text for text, _ in readings}) < len(readings):
    st.caption("The picks' models read the same sentence as different tokens, so each pick is drawn on its own "
               "tokens and their cells do not line up: " + "; ".join(
                   f"pick{'s' if len(group) > 1 else ''} {', '.join(str(i) for i, _, _ in group)} "
                   f"({group[0][1]}): {group[0][2]} tokens" for group in readings.values()) + ".")
full = pick_full_resolution([p[2] for p in picks], list(range(1, n + 1)), "full_pick", "Pick at full resolution",
                            "pick", lambda i: f"Pick {i}")
if full is not None:
    model, att, v, layer, head = picks[full - 1]
    chart(head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, zmax=zmax, height=760, max_cells=None,
                       visible=v.visible(layer),
                       title=f"Pick {full}: {model.title} · {head_label(layer, head)}, every weight"),
          "compare-full")

if n == 1:
    st.stop()
st.subheader("Difference")
a, b, _ = st.columns([1, 1, 3])
ia = choose("From pick", list(range(1, n + 1)), "diff_a", default=1, container=a)
ib = choose("minus pick", list(range(1, n + 1)), "diff_b", default=2, container=b)
(_, att_a, va, la, ha), (_, _, vb, lb, hb) = picks[ia - 1], picks[ib - 1]
if ia == ib:
    st.info("Pick two different picks to see their difference.")
elif va.query_labels != vb.query_labels or va.key_labels != vb.key_labels:
    st.info(f"Picks {ia} and {ib} have different tokens, so their weights cannot be subtracted cell by cell.")
else:
    diff = head_heatmap(va.head(la, ha) - vb.head(lb, hb), va.query_labels, va.key_labels, diverging=True,
                        title=f"Pick {ia} − pick {ib}", visible=va.visible(la) if va.causal and vb.causal else None)
    chart(diff, "compare-diff")
    exports("compare-diff", diff, att_a, sig=f"{ia}|{ib}|{s}|{[p[1].text for p in picks]}")
