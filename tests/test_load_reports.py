"""The class benches' reports read as sentences with their figures, both kinds (a class on MiniLM, swept before and
after, and one on an LLM, whose memory after the sessions is a series), without a server."""
from harness.load import LoadReport
from harness.load_llm import LlmLoadReport


def test_a_class_report_gives_its_memory_swept_before_and_after_and_an_llm_class_its_own():
    report = LoadReport(8, 40, actions=2, latencies=[1.0, 3.0], kinds=["type", "Explore"],
                        memory_mib=[(0.0, 700.0), (10.0, 900.0), (20.0, 760.0)], warm_at=0.0)
    assert "swept" not in report.summary()  # not measured
    report.swept_before_mib, report.swept_after_mib = 700.4, 812.0
    assert report.swept_returned_mib == 812.0 - 700.4
    assert report.summary().endswith("; swept, 700 MiB before the sessions and 812 MiB after they closed (+112 MiB)")
    assert "700 MiB when all sessions were open, 760 MiB at the end (peak 900); second half -140 MiB" in report.summary()
    llm = LlmLoadReport(4, 60, actions=1, latencies=[2.0], kinds=["type"], memory_mib=[(0.0, 1000.0), (30.0, 1500.0)],
                        sessions_at=10.0, loaded_mib=900.0, before_mib=1000.0, after_mib=[(5.0, 1300.0), (30.0, 1100.0)])
    assert "swept" not in llm.summary() and llm.returned_mib == 100.0
    assert llm.memory().endswith("after they closed 1300 MiB at 5 s, 1100 MiB at 30 s (+100 MiB from before)")
