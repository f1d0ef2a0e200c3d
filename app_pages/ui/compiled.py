"""A compiled program's known algorithm shown beside what HeadLens finds: a head's card (what the compiler put in it
and what its explanation names) and the true edges beside a circuit's scores."""
from __future__ import annotations

import streamlit as st

from analysis.circuits import EdgeScores
from analysis.compiled import edges_beside, head_beside
from models.compiled import ground_truth
from models.compiled_truth import EMBED, OUTPUT, block_name

from ..results.explanations import explanations
from ..results.messages import plain
from ..results.models import ModelRef, cached_model
from .card_view import on_text
from .settings import Settings

READS = {"q": "its queries", "k": "its keys", "v": "its values", "mlp": "its input", "output": "the output"}


def opening(ref: ModelRef) -> tuple[int, int] | None:
    """The head a compiled program's card opens on: the last the compiler put a Select in (the output's, in most)."""
    heads = ground_truth(cached_model(ref)).blocks.dropna(subset=["head"])
    return None if heads.empty else (int(heads.iloc[-1]["layer"]), int(heads.iloc[-1]["head"]))


def _block(name: str) -> str:
    return {EMBED: "the tokens and positions", OUTPUT: "the output"}.get(name, name)


def head_card(s: Settings, ref: ModelRef, layer: int, head: int, text: str) -> None:
    """A compiled head's card: what the compiler put in it beside what its explanation (fitted and held out on the
    program's own random inputs) names, the blocks it reads and feeds, and the head on the sidebar's input."""
    truth = ground_truth(cached_model(ref))
    frame = explanations(ref, s.causal, s.heads_off)
    found = head_beside(truth, frame, layer, head)
    left, right = st.columns(2)
    left.markdown("**Compiled to**")
    if found["compiled"] is None:
        left.markdown("Nothing: the compiler left this head empty (its block's work is in the feed-forward).")
    else:
        left.code(found["compiled"], language=None)
    right.markdown("**HeadLens found**")
    right.code(found["found"], language=None)
    sentence = found["sentence"].replace("[CLS]", "the BOS")  # a compiled program's first token
    right.caption(plain(f"{sentence[0].upper()}{sentence[1:]}: held-out score {found['score']:.2f}, IoU "
                        f"{found['iou']:.2f}, on {frame.attrs.get('held_out', 0)} random inputs it was not fitted on."))
    if found["agrees"] is True:
        st.success("The explanation names the comparison the compiler placed.", icon=":material/check_circle:")
    elif found["agrees"] is False:
        st.warning("The explanation does not name the compiled comparison: this head compares a value the program "
                   "computes, which the rules over the tokens and the positions cannot name.",
                   icon=":material/report:")
    me = block_name(layer, head)
    edges = truth.edges
    into = [f"{READS[e.input]} from {_block(e.sender)}"
            for e in sorted(edges.itertuples(), key=lambda e: list(READS).index(e.input)) if e.receiver == me]
    out = [_block(e.receiver) for e in edges.itertuples() if e.sender == me]
    if into or out:
        st.caption(plain("True edges: it reads " + (", ".join(into) or "nothing") + "; it feeds "
                         + (", ".join(out) or "nothing") + "."))
    on_text(s, layer, head, text, yours="input")


def truth_section(ref: ModelRef, scores: EdgeScores, n: int, kinds) -> None:
    """The compiled program's true edges beside the circuit's scores: each one's rank, whether the circuit of ``n``
    edges holds it, and the scores' edge AUROC."""
    truth = ground_truth(cached_model(ref))
    frame, area = edges_beside(scores, truth, n, kinds)
    st.subheader("The compiled truth")
    held = int(frame["in_circuit"].sum())
    st.caption(plain(f"The compiler's {len(frame)} true edges: the circuit of {n:,} edges holds {held}. Edge AUROC "
                     f"{area:.2f}: the chance a true edge scores above a false one. An edge carrying what both inputs "
                     "of a pair share (the positions, the BOS) no patching from the corrupted input moves, so it "
                     "scores 0 whatever the method."))
    st.dataframe(frame, hide_index=True, column_config={"score": st.column_config.NumberColumn(format="%.3f")})
