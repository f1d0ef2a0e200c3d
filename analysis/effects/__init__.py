"""Which heads make a prediction: direct logit attribution and activation patching, one prompt pair at a time
(``frames``), or many pairs batched (``batched``, which tasks and circuits read), from what each head writes into
a prompt's run (``parts``); what a prediction is on each kind of model, its ``readouts``."""
from .frames import (METHODS, grid, logit_attribution, parts_total, patch_heads, patch_residual, repeated_pair,
                     top_predictions)
from .inputs import answer_token, token_text
from .readouts import Readout, own_readout, readout_for, readout_reading, readouts

__all__ = ["METHODS", "Readout", "answer_token", "grid", "logit_attribution", "own_readout", "parts_total",
           "patch_heads", "patch_residual", "readout_for", "readout_reading", "readouts", "repeated_pair",
           "token_text", "top_predictions"]
