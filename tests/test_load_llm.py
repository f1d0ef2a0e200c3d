"""A class on the LLM, shortened: one session training a decoder, one on a 3,000-token prompt switching
layers, two typing sentences and opening pages (one on each engine), all on SmolLM2 on one server for 60 s (and on
until each session has tried two actions, however slow the machine), once
the server has read its pages' preparation (the run's one, from nothing: ``tests.prepared``). No errors, the
server's peak within 3 GiB, and once the sessions close it returns within 300 MiB of where it was
before they came (followed for up to 30 s, until it has). bench/bench_load.py --llm runs the full mix and prints
its latencies; the report is written to artifacts/load-llm.txt.
"""
from models import load_model
from harness.browser import LOGS, ROOT
from harness.load_llm import TRAINING, run_llm_load
from harness.texts import prompt
from tests.test_app_long import NAME

PEAK_MIB, RETURN_MIB = 3 * 1024, 300
# a one-layer decoder of width 16: its first logged step (every 20 steps) comes within seconds however busy the
# sessions keep the machine; the server's memory is its proportional set with the training's process
SMALL = TRAINING + "&train_layers=1&train_width=16&train_seq=16"


def test_a_class_on_smollm2_shares_the_server_and_gives_its_memory_back(load_server, prepared):
    text = prompt(load_model(NAME, backend="transformers").tokenizer, 3000, seed=3)
    # a new server on the run's one preparation (``tests.prepared``): it reads every step from that folder
    env = {"HEADLENS_WARM_UP": "1", "HEADLENS_RESULTS": str(prepared.finished().folder),
           "HEADLENS_PRELOAD": "smollm2"}  # as a class on it is served (docs/app.md)
    with load_server(env=env) as (url, proc):
        report = run_llm_load(url, proc.pid, "smollm2", [text], 30, visitors=2, long_prompts=1, trainers=1,
                              seconds=60, settle=30, training=SMALL, idle_s=5,
                              idle_switches=1, at_least=2, returned_within=RETURN_MIB)
        port = url.rsplit(":", 1)[1]
    log = (LOGS / f"streamlit-{port}.log").read_text(errors="replace")
    lines = [report.summary(), "by action: " + report.by_kind(), report.memory(), *report.errors]
    (ROOT / "artifacts" / "load-llm.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    assert not report.errors, report.errors
    assert "Traceback" not in log and "Error" not in log, log[-3000:]
    # each session tried at least two actions however long they took (no error: each finished)
    assert report.kinds.count("layer switch") >= 2 and report.kinds.count("start training") == 1
    assert report.trained_steps > 0 and report.idle_steps_s > 0
    assert len([k for k in report.kinds if k not in ("layer switch", "start training", "long prompt",
                                                     "idle layer switch")]) >= 4
    assert report.peak_mib <= PEAK_MIB, report.memory()
    assert report.returned_mib <= RETURN_MIB, report.memory()
