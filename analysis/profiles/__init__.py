"""Profiles of every head over a corpus and the work that scales out: one pass over a corpus a chunk at a time
(``corpus``), Ray Data for the command lines (``ray``) and the profile's command line into a Parquet file the app
opens (``run``: ``python -m analysis.profiles.run``)."""
