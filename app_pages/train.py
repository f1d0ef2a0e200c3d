"""Train: a small decoder learns on our multi-head attention while the page shows its heads form."""
import streamlit as st

from app_pages.ui.exports import chart, model_zip
from app_pages.ui.messages import plain
from app_pages.ui.settings import TRAINED
from app_pages.ui.state import remember
from app_pages.ui.training import MAX_RUNNING, MAX_SECONDS, current_job, start_job, trained_job
from models import HeadLensError
from models.training import LIMITS, TASKS, TrainConfig
from viz import head_grid
from viz.training import training_curves

TASK_NAMES = {"induction": "Induction: random tokens with a repeated segment",
              "text": "Text: the next word of the built-in corpus, or of your text"}
DEFAULTS = {"induction": dict(vocab=64, attention_only=True), "text": dict(vocab=1024, attention_only=False)}
EXPLORE = "app_pages/explore.py"
COMPARE = "app_pages/compare.py"

ss = st.session_state
if ss.pop("_train_goto", None):
    st.switch_page(ss.pop("_train_page"))

st.title("Train")
st.caption("A decoder of pre-LayerNorm blocks, on HeadLens's own multi-head attention, learns here while you watch. "
           "On the induction task, a previous-token head forms in the first layer and an induction head above it "
           "(attending to the token after the earlier occurrence of the current one), in an abrupt phase change "
           "(Olsson et al., 2022). Each head is scored on held-out sequences made of a half and the same half again.")

job = current_job()
running = job is not None and job.running

task = st.segmented_control("Task", list(TASKS), format_func=TASK_NAMES.get, key="train_task", default="induction",
                            required=True, disabled=running)
d = DEFAULTS[task]
a, b, c, e = st.columns(4)
n_layers = a.slider("Layers", 1, LIMITS["n_layers"], 2, key="train_layers", disabled=running)
n_heads = b.select_slider("Heads per layer", [1, 2, 4, 8], 2, key="train_heads", disabled=running)
d_model = c.select_slider("Width (d_model)", [16, 32, 64, 128, 256], 64, key="train_width", disabled=running)
steps = e.number_input("Steps", 100, LIMITS["steps"], 2000, step=100, key="train_steps", disabled=running)
a, b, c, e = st.columns(4)
seq_len = a.select_slider("Sequence length", [16, 32, 64, 128], 32, key="train_seq", disabled=running)
vocab = b.select_slider("Vocabulary", [16, 32, 64, 128, 256, 512, 1024, 2048, 4096], d["vocab"],
                        key=f"train_vocab_{task}", disabled=running,
                        help="Token kinds t0 … for induction; for text, the most frequent words (the rest read [UNK]).")
lr = c.select_slider("Learning rate", [1e-4, 3e-4, 1e-3, 3e-3, 1e-2], 1e-3, key="train_lr", disabled=running,
                     format_func=lambda x: f"{x:g}")
seed = e.number_input("Seed", 0, 2**31 - 1, 0, key="train_seed", disabled=running)
attention_only = st.toggle("Attention only (no MLP)", d["attention_only"], key=f"train_attn_only_{task}",
                           disabled=running)
text = None
if task == "text":
    text = st.text_area("Your text (empty: the built-in corpus)", key="train_text", height=100, max_chars=200_000,
                        disabled=running).strip() or None

st.caption(f"Each training runs at most {LIMITS['steps']:,} steps and {MAX_SECONDS // 60} minutes; "
           f"{MAX_RUNNING} run at once on this server, and leaving the page's session stops yours.")
left, right, _ = st.columns([1, 1, 4])
if left.button("Start", type="primary", disabled=running, key="train_start"):
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
if right.button("Stop", disabled=not running, key="train_stop"):
    job.stop()
    job.thread.join(timeout=10)
    st.rerun()  # the controls above were drawn while it ran


def summary(job) -> str:
    run = job.run
    reached = run.step_reaching(0.4)
    last = run.history[run.history.step == run.history.step.max()]
    best = last.loc[last.induction.idxmax()]
    said = (f"{'Stopped after' if run.stopped else 'Trained'} {run.steps_done:,} steps in {run.seconds:.0f} s "
            f"({run.steps_per_second():.0f} steps/s on {run.device}); last loss {last.loss.iloc[0]:.3f}. ")
    said += (f"An induction score of 0.4 was first reached at step {reached:,}; " if reached is not None
             else "No head reached an induction score of 0.4; ")
    return said + (f"the strongest induction head now is L{int(best['layer'])} H{int(best['head'])} "
                   f"({best['induction']:.2f}).")


def snapshots(run) -> None:
    kept = run.snapshots  # the list is replaced whole by the training thread, never changed in place
    steps = [s for s, _ in kept]
    if len(steps) > 1:
        if ss.get("train_snapshot") not in steps or ss.get("train_snapshot") == ss.get("_train_latest"):
            ss["train_snapshot"] = steps[-1]  # follow the training until the slider is moved back
        ss["_train_latest"] = steps[-1]
        step = st.select_slider("Snapshot at step", steps, key="train_snapshot",
                                help="Replay the kept snapshots; at the right end it follows the training.")
    else:
        step = steps[0]
    weights = dict(kept)[step]
    tokens = run.probe
    heads = list(range(weights.shape[1]))
    for layer in range(weights.shape[0]):
        chart(head_grid(weights[layer], tokens, tokens, heads, cols=min(4, len(heads)), cell_px=240,
                        title=f"Layer {layer} on the probe sequence · step {step:,}"), f"train-grid-{layer}")


def live() -> None:
    job = current_job()
    if job is None:
        st.info("Pick a task and a size, then press Start.")
        return
    if job.state == "waiting":
        st.info(f"{MAX_RUNNING} trainings are running on this server; yours starts when one of them ends.")
    elif job.state == "training" and job.run is not None:
        run = job.run
        st.progress(min(run.steps_done / job.config.steps, 1.0),
                    text=f"Step {run.steps_done:,} of {job.config.steps:,} · {run.seconds:.0f} s · "
                         f"{run.steps_per_second():.0f} steps/s on {run.device}")
    elif job.state == "training":
        st.info("Starting…")
    elif job.state == "failed":
        st.error(plain(job.error or "The training failed."))
    else:
        st.success(summary(job))
    if running and not job.running:
        st.rerun()  # the whole page: the buttons, and the trained model in the sidebar
    run = job.run
    if run is None:
        return
    chart(training_curves(run.history, title=f"{job.config.task} · {job.config.n_layers} layers × "
                                            f"{job.config.n_heads} heads · d_model {job.config.d_model}"),
          "train-curves")
    st.caption("Previous-token score: a head's mean weight on the token just before each query. Induction score: "
               "on the held-out repeats, the mean weight from each token of the second half on the token after its "
               "earlier occurrence. Layer 0's heads are dashed.")
    st.subheader("Every head on the probe sequence")
    st.caption("The first held-out sequence: a half, then the same half again. An induction head draws a diagonal "
               "one below the main one's reflection in the second half; a previous-token head, the line just under "
               "the main diagonal.")
    snapshots(run)


st.fragment(run_every=1.5 if running else None)(live)()

job = trained_job()
if job is not None and not running:
    st.subheader("Use the trained model")

    def go(choice: str, page: str) -> None:
        for key, value in (("model", choice), ("text", " ".join(job.run.probe))):
            ss.pop(key, None)  # the sidebar's widget starts again, from the kept value
            remember(key, value)
        ss["_train_goto"], ss["_train_page"] = True, page

    a, b, c, e = st.columns(4)
    a.button("Explore this model", on_click=go, args=("trained", EXPLORE), type="primary", key="train_explore",
             help="Opens it in Explore with the probe sequence; the sidebar's model list now has it, and its "
                  "step-0 self, for every page.")
    b.button("Compare step 0 with the last", on_click=go, args=("trained", COMPARE), key="train_compare")
    c.download_button("Model · ZIP", lambda: model_zip(job.run.model, f"headlens-trained-{job.id}"),
                      f"headlens-trained-{job.id}.zip", "application/zip",
                      key="train-zip", on_click="ignore",
                      help="safetensors, config.json and the tokenizer: load_model(folder, backend=\"scratch\") opens it.")
    e.download_button("History · CSV", lambda: job.run.history.to_csv(index=False).encode(),
                      f"headlens-training-{job.id}.csv", "text/csv", key="train-csv", on_click="ignore")
    st.caption(f"In the sidebar: {TRAINED['trained']} and {TRAINED['trained_start'].lower()}. Its tokens are "
               + ("t0 … separated by spaces." if job.config.task == "induction" else "lowercased words."))
