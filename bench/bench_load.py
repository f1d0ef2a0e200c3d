"""Many people at once: browser sessions on one server for a while, each typing and switching pages.

    python -m bench.bench_load [--sessions 8] [--seconds 60]

Starts ``streamlit run app.py`` with the repository's server defaults, lets one visitor open every
page (model, spaCy and the corpus profile loaded, as whoever starts the server for a class would),
then runs the sessions side by side in one Chromium (each context its own Streamlit session).
Prints the errors (target 0), the rerun latency percentiles per action, the server's memory over
the run (target: bounded) and how busy the machine was: the browsers share its cores with the
server, so latencies here include rendering eight pages on the same two cores.
"""
from __future__ import annotations

import argparse

from bench.common import machine
from tests.browser import streamlit_server
from tests.load import run_load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    print(machine())
    with streamlit_server() as (url, proc):
        report = run_load(url, proc.pid, args.sessions, args.seconds)
    print(report.summary())
    print("by action:", report.by_kind())
    thirds = [report.rss_at(report.warm_at + f * (report.rss_mib[-1][0] - report.warm_at)) for f in (0, 1 / 3, 2 / 3, 1)]
    print("server memory at 0, 1/3, 2/3 and the end of the run (MiB):", ", ".join(f"{m:.0f}" for m in thirds))
    for line in report.errors:
        print("error:", line)


if __name__ == "__main__":
    main()
