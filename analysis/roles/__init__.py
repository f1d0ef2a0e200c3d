"""What each head does: its measures over many sentences and a role in words (``measure``, ``labels``), the seed's
four foci (``foci``), the decoder head detector (``detector``), the rules that say where a head should attend
(``rules``, which ``analysis.explanations`` scores) and the roles of a long document (``long``)."""
