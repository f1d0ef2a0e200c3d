"""One head on one card (``card``), every head as one row of measures and a map of them (``atlas``), and both from
Python, each part computed as its page computes it (``build``: ``card_parts``, ``head_card``, ``atlas``)."""
