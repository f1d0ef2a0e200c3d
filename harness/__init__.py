"""What drives HeadLens from outside, for the tests, the benchmarks and the scripts: a Streamlit server and Chromium
(``browser``), a class of sessions under load (``load``, ``load_llm``), the texts they type (``texts``) and reference
computations the engine is held to (``reference``)."""
