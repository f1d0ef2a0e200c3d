"""Eight people at once for 20 seconds: no errors, and what they leave held is given back once they go.

The run takes about two minutes (a warm-up tour of every page while the server prepares the default model, then 20 s
of eight sessions typing sentences and switching pages, each going on, however slow the machine, until it has tried
two actions and typed a sentence) and stops by itself; bench/bench_load.py prints the same run's latencies. The report is written to artifacts/load.txt.
"""
from app_pages.ui.janitor import HELD_LOG
from harness.browser import LOGS, ROOT
from harness.load import run_load

SESSIONS, SECONDS, AT_LEAST = 8, 20, 2
# Everything the server keeps is bounded (4 models, 64 results within 1 GiB, 4 profiles) and loaded during the
# warm-up; what the sessions' own results hold is dropped by the janitor once they close. Measured once it has swept,
# before the sessions came and after they went: a rerun's working memory (eight at once, 100 MiB and more of the
# server's memory while they run) is not counted, only what stays.
MAX_HELD_AFTER_MIB = 150


def test_eight_sessions_share_the_server(load_server, tmp_path):
    held = str(tmp_path / "held.jsonl")
    with load_server(env={HELD_LOG: held}) as (url, proc):
        report = run_load(url, proc.pid, SESSIONS, SECONDS, held_log=held, at_least=AT_LEAST)
        port = url.rsplit(":", 1)[1]
    log = (LOGS / f"streamlit-{port}.log").read_text(errors="replace")
    out = ROOT / "artifacts" / "load.txt"
    out.write_text("\n".join([report.summary(), "by action: " + report.by_kind(), *report.errors]) + "\n")
    print(report.summary())
    assert not report.errors, report.errors
    assert "Traceback" not in log and "Error" not in log, log[-3000:]
    assert report.actions >= AT_LEAST * SESSIONS  # every session kept working, not just opened: each action finished
    assert report.kinds.count("type") >= SESSIONS
    assert report.swept_returned_mib < MAX_HELD_AFTER_MIB, report.summary()
