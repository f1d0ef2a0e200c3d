"""Attention as the pages show it: a view of a result (special tokens set aside, subwords merged: ``views``), a long
prompt's pooled grids and zooms (``long``), which heads behave alike (``similarity``), attention across layers
(``flow``: rollout and flow) and attention as files (``export``)."""
