"""The controls every page shares; their values live in session state and the URL."""
from __future__ import annotations

import streamlit as st
import torch

from models import HeadLensError, head_label
from models.compiled import MAX_LENGTH, vocab_words
from models.corpus import DEFAULT_TEXT, EXAMPLES

from ..results.messages import stop_with
from ..results.models import CUSTOM, LLM, SCRATCH, TYPED
from .models import EXAMPLE, EXAMPLE_VOCAB, EXAMPLE_LENGTH, model_for, model_names, ref_for
from .settings import MAX_CHARS
from .state import bound, flag, head_from_url, head_to_url, remember
from .warm_up import warm_up, warm_up_note


def _load_example() -> None:
    name = st.session_state.get("example")
    if name in EXAMPLES:
        remember("text", EXAMPLES[name])
        st.session_state.pop("text", None)  # the text box starts again, from the example


def sidebar() -> None:
    sb = st.sidebar
    names = model_names()
    choice = bound(sb.selectbox, "model", "minilm", init="index", options=list(names), label="Model",
                   format_func=names.get)
    if choice in CUSTOM:
        bound(sb.text_input, "custom_model", "", label="Model id or folder",
              placeholder="bert-base-uncased or /path/to/model",
              help="A model already in the local Hugging Face cache, or a folder with config.json and "
                   "model.safetensors. Nothing is downloaded unless the switch below is on.")
        bound(sb.toggle, "custom_download", False, cast=flag, label="Download it if it is not here",
              help="Fetch a model id that is not in the local cache from the Hugging Face Hub: its file list and "
                   "config are checked first (safetensors weights only, no model code, sizes within HeadLens's "
                   "limits), then only the config, the tokenizer and the weights are fetched, with progress. "
                   "Off, HeadLens works without a network.")
    if choice == TYPED:
        bound(sb.text_area, "rasp_program", EXAMPLE, valid=lambda t: len(t) <= MAX_CHARS, label="RASP program",
              height=160, max_chars=MAX_CHARS,
              help="One assignment per line, the last the output. tokens, indices and length are given; "
                   "select(keys, queries, ==|!=|<|<=|>|>=|true), aggregate(selector, values), selector_width("
                   "selector), map(f of x, values), sequence_map(f of x and y, a, b), numerical(...), "
                   "categorical(...). A map's f uses + - * / // %, comparisons, and, or, not, a if c else b, min, "
                   "max, abs, numbers and quoted strings. Parsed by a grammar, never run as Python. Press Ctrl+Enter "
                   "to compile.")
        cols = sb.columns([3, 2])
        with cols[0]:
            bound(st.text_input, "rasp_vocab", EXAMPLE_VOCAB, label="Its tokens", help="Separated by spaces.")
        with cols[1]:
            bound(st.number_input, "rasp_length", EXAMPLE_LENGTH, cast=int, valid=lambda v: 1 <= v <= MAX_LENGTH,
                  label="Longest input", min_value=1, max_value=MAX_LENGTH, step=1)
        bound(sb.toggle, "rasp_causal", False, cast=flag, label="Compile causal",
              help="Each position sees only itself and earlier ones.")
    devices = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    device = bound(sb.selectbox, "device", "auto", init="index", options=devices, label="Device")
    try:
        program = ref_for(choice, "auto").program
    except HeadLensError as err:  # a typed vocabulary with no token
        stop_with(err)
    if program is not None:  # a compiled program reads its own tokens, not sentences
        bound(sb.text_area, f"tokens_{choice}", program.example, valid=lambda t: len(t) <= MAX_CHARS,
              label=f"Inputs, one per line: tokens {vocab_words(program.vocab)}, at most {program.max_seq_len}",
              height=100, max_chars=MAX_CHARS, help=f"{program.about.capitalize()}. Tokens separated by spaces; "
                                                     "the BOS is put first. Press Ctrl+Enter to apply.")
    else:
        sb.selectbox("Examples", list(EXAMPLES), index=None, placeholder="Load an example…", key="example",
                     on_change=_load_example)
        bound(sb.text_area, "text", DEFAULT_TEXT, valid=lambda t: len(t) <= MAX_CHARS,
              label="Sentences, one per line", height=140, max_chars=MAX_CHARS, help="Press Ctrl+Enter to apply.")
    sb.subheader("View options")
    causal = choice in LLM  # a bundled decoder's mask: always causal, so its first token can be a sink
    bound(sb.toggle, "hide_special", False, cast=flag, label="Hide the first token (sink)" if causal else
          "Hide special tokens", help="Drop [CLS], [SEP], <s>… and, in a decoder, the first token when most "
          "attention parks on it (a sink); renormalise each row.")
    bound(sb.toggle, "merge_words", False, cast=flag, label="Merge subwords into words",
          help="Sum over a word's pieces as keys, average over them as queries (Clark et al., 2019).")
    bound(sb.toggle, "shared_scale", True, cast=flag, label="One colour scale for all heads")
    bound(sb.toggle, "moved", False, cast=flag, label="Weight by what each key sends",
          disabled=ref_for(choice, "auto").editable() is None,
          help="Scale each weight by the length of what its key sends through the head, ||α W_O (W_V x + b)|| "
               "(Kobayashi et al. 2020), then each row to 1: attention to a token that sends little, such as "
               "[SEP] or a sink, counts for little. This sentence's views only; profiles and pruning use raw "
               "attention. Runs the from-scratch engine with the same weights; not for custom models.")
    scratch = choice in SCRATCH
    if causal:  # shown on, and left alone
        sb.toggle("Causal mask", True, disabled=True, key="causal_decoder",
                  help="A decoder: each token always sees only itself and earlier ones.")
    elif program is not None:  # as compiled
        sb.toggle("Causal mask", program.causal, disabled=True, key=f"causal_{choice}",
                  help="As the program was compiled.")
    else:
        bound(sb.toggle, "causal", False, cast=flag, label="Causal mask", disabled=not scratch,
              help="Each token sees only earlier ones; the from-scratch engine only.")
    ref = ref_for(choice, device)
    model = model_for(ref, container=sb)
    if scratch:
        heads = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
        bound(sb.multiselect, "heads_off", [], init="default", options=heads, multi=True, cast=head_from_url,
              to_url=head_to_url, format_func=lambda h: head_label(*h), label="Switch heads off",
              placeholder="L0 H0",
              help="Head masking, from-scratch engine only; later layers then see the model without those heads.")
    sb.caption(f"Running on **{model.device}** · {model.n_layers} layers × {model.n_heads} heads")
    warm_up(ref)  # a bundled decoder's slow pages prepared once, in the background (for another model, spaCy)
    note = warm_up_note(ref)  # None where nothing is being prepared
    if note is not None:
        sb.caption(note)
