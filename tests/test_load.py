"""Eight people at once for 40 seconds: no errors, and the server's memory levels off.

The run takes about a minute and a half (a warm-up tour of every page, then 40 s of eight sessions
typing sentences and switching pages) and stops by itself; bench/bench_load.py prints the same
run's latencies. The report is written to artifacts/load.txt.
"""
from harness.browser import LOGS, ROOT
from harness.load import run_load

SESSIONS, SECONDS = 8, 40
# Everything the server keeps is bounded (4 models, 64 results within 1 GiB, 4 profiles) and
# loaded during the warm-up; what grows after it is per-session state and allocator slack.
MAX_GROWTH_SECOND_HALF_MIB = 200


def test_eight_sessions_share_the_server(load_server):
    with load_server() as (url, proc):
        report = run_load(url, proc.pid, SESSIONS, SECONDS)
        port = url.rsplit(":", 1)[1]
    log = (LOGS / f"streamlit-{port}.log").read_text(errors="replace")
    out = ROOT / "artifacts" / "load.txt"
    out.write_text("\n".join([report.summary(), "by action: " + report.by_kind(), *report.errors]) + "\n")
    print(report.summary())
    assert not report.errors, report.errors
    assert "Traceback" not in log and "Error" not in log, log[-3000:]
    assert report.actions >= 2 * SESSIONS  # every session kept working, not just opened
    assert report.kinds.count("type") >= SESSIONS
    assert report.rss_growth_second_half < MAX_GROWTH_SECOND_HALF_MIB, report.summary()
