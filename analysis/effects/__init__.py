"""Which heads make a prediction: direct logit attribution and activation patching, one prompt pair at a time
(``frames``), or many pairs batched (``batched``, which tasks and circuits read), from what each head writes into
a prompt's run (``parts``)."""
from .frames import (METHODS, answer_token, grid, logit_attribution, masked_pair, parts_total, patch_heads,
                     patch_residual, repeated_pair, token_text, top_predictions)

__all__ = ["METHODS", "answer_token", "grid", "logit_attribution", "masked_pair", "parts_total", "patch_heads",
           "patch_residual", "repeated_pair", "token_text", "top_predictions"]
