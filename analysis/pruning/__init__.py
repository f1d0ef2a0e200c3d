"""Whether a head matters: switching heads off (``ablation``), each head's importance (``importance``) and pruning
curves (``curves``)."""
