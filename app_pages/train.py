"""Train: a small decoder learns on our multi-head attention while the page shows its heads form."""
import streamlit as st

from app_pages.results.messages import plain
from app_pages.results.models import TRAINED, current_job, trained_job
from app_pages.ui.exports import chart, model_zip
from app_pages.ui.page import start
from app_pages.ui.state import bound, flag, open_page
from app_pages.ui.training import (
    ABOUT,
    DEFAULTS,
    MAX_RUNNING,
    MAX_SECONDS,
    TASK_NAMES,
    snapshot_grids,
    start_job,
    summary,
)
from models import HeadLensError
from models.training import LIMITS, TASKS, TrainConfig
from viz.training import training_curves

ss = st.session_state

start("train")
st.caption("A decoder of pre-LayerNorm blocks, on HeadLens's own multi-head attention, learns here while you watch. "
           "On the induction task, a previous-token head forms in the first layer and an induction head above it "
           "(attending to the token after the earlier occurrence of the current one), in an abrupt phase change "
           "(Olsson et al., 2022). Each head is scored on held-out sequences made of a half and the same half again.")

job = current_job()
running = job is not None and job.running
locked = dict(disabled=running)
task = bound(st.segmented_control, "train_task", "induction", init="default", options=list(TASKS), label="Task",
             format_func=TASK_NAMES.get, required=True, **locked)
d = DEFAULTS[task]
a, b, c, e = st.columns(4)
n_layers = bound(a.slider, "train_layers", 2, cast=int, valid=lambda v: 1 <= v <= LIMITS["n_layers"], label="Layers",
                 min_value=1, max_value=LIMITS["n_layers"], **locked)
n_heads = bound(b.select_slider, "train_heads", 2, options=[1, 2, 4, 8], cast=int, label="Heads per layer", **locked)
d_model = bound(c.select_slider, "train_width", 64, options=[16, 32, 64, 128, 256], cast=int, label="Width (d_model)",
                **locked)
steps = bound(e.number_input, "train_steps", 2000, cast=int, valid=lambda v: 100 <= v <= LIMITS["steps"], label="Steps",
              min_value=100, max_value=LIMITS["steps"], step=100, **locked)
a, b, c, e = st.columns(4)
seq_len = bound(a.select_slider, "train_seq", 32, options=[16, 32, 64, 128], cast=int, label="Sequence length",
                **locked)
vocab = bound(b.select_slider, f"train_vocab_{task}", d["vocab"], options=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
              cast=int, label="Vocabulary", **locked,
              help="Token kinds t0 … for induction; for text, the most frequent words (the rest read [UNK]).")
lr = bound(c.select_slider, "train_lr", 1e-3, options=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2], cast=float, label="Learning rate",
           format_func=lambda x: f"{x:g}", **locked)
seed = bound(e.number_input, "train_seed", 0, cast=int, valid=lambda v: 0 <= v < 2**31, label="Seed", min_value=0,
             max_value=2**31 - 1, **locked)
attention_only = bound(st.toggle, f"train_attn_only_{task}", d["attention_only"], cast=flag,
                       label="Attention only (no MLP)", **locked)
text = None
if task == "text":
    text = st.text_area("Your text (empty: the built-in corpus)", key="train_text", height=100, max_chars=200_000,
                        **locked).strip() or None

st.caption(f"Each training runs at most {LIMITS['steps']:,} steps and {MAX_SECONDS // 60} minutes; "
           f"{MAX_RUNNING} run at once on this server, and leaving the page's session stops yours.")
left, right, _ = st.columns([1, 1, 4])
if left.button("Start", type="primary", key="train_start", **locked):
    config = TrainConfig(task=task, n_layers=n_layers, n_heads=n_heads, d_model=d_model, seq_len=seq_len,
                         vocab_size=vocab, attention_only=attention_only, steps=int(steps), lr=lr, seed=int(seed))
    try:
        config.check()
    except HeadLensError as err:
        st.error(plain(str(err)))
        st.stop()
    ss.pop("train_snapshot", None)
    job = start_job(config, text=text, device=ss.get("device", "auto"))
    running = True
if right.button("Stop", disabled=not running or job.stopping, key="train_stop"):
    job.stop()  # the thread ends after its current step; the live part below then redraws the page


def live() -> None:
    job = current_job()
    if job is None:
        st.info("Pick a task and a size, then press Start.")
        return
    run = job.run
    if job.state == "waiting":
        st.info(f"{MAX_RUNNING} trainings are running on this server; yours starts when one of them ends.")
    elif job.state == "training" and run is not None:
        st.progress(min(run.steps_done / job.config.steps, 1.0),
                    text=f"{'Stopping at' if job.stopping else 'Step'} {run.steps_done:,} of {job.config.steps:,} · "
                         f"{run.seconds:.0f} s · {run.steps_per_second():.0f} steps/s on {run.device}")
    elif job.state == "training":
        st.info("Starting…")
    elif job.state == "failed":
        st.error(plain(job.error or "The training failed."))
    else:
        st.success(summary(job))
    if running and not job.running:
        st.rerun()  # the whole page: the buttons, and the trained model in the sidebar
    if run is None:
        return
    c = job.config
    title = f"{c.task} · {c.n_layers} layers × {c.n_heads} heads · d_model {c.d_model}"
    chart(training_curves(run.history, title=title), "train-curves")
    st.caption(ABOUT["curves"])
    st.subheader("Every head on the probe sequence")
    st.caption(ABOUT["probe"])
    snapshot_grids(run)


st.fragment(run_every=1.5 if running else None)(live)()

job = trained_job()
if job is not None and not running:
    st.subheader("Use the trained model")
    opened = {"model": "trained", "text": " ".join(job.run.probe)}
    a, b, c, e = st.columns(4)
    a.button("Explore this model", on_click=open_page, args=("app_pages/explore.py",), kwargs=opened, type="primary",
             key="train_explore", help="Opens it in Explore with the probe sequence; the sidebar's model list now has "
                                       "it, and its step-0 self, for every page.")
    b.button("Compare step 0 with the last", on_click=open_page, args=("app_pages/compare.py",), kwargs=opened,
             key="train_compare")
    c.download_button("Model · ZIP", lambda: model_zip(job.run.model, f"headlens-trained-{job.id}"),
                      f"headlens-trained-{job.id}.zip", "application/zip", key="train-zip", on_click="ignore",
                      help="safetensors, config.json and the tokenizer: load_model(folder, backend=\"scratch\") opens it.")
    e.download_button("History · CSV", lambda: job.run.history.to_csv(index=False).encode(),
                      f"headlens-training-{job.id}.csv", "text/csv", key="train-csv", on_click="ignore")
    st.caption(f"In the sidebar: {TRAINED['trained']} and {TRAINED['trained_start'].lower()}. Its tokens are "
               + ("t0 … separated by spaces." if job.config.task == "induction" else "lowercased words."))
