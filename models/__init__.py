"""Attention engines: our from-scratch multi-head attention and encoder, and transformers models."""
from .encoder import BertEncoder, EncoderConfig
from .errors import HeadLensError
from .mha import MultiHeadAttention
from .result import Attention
from .loading import AttentionModel, load_model, pick_device

__version__ = "0.15.0"  # HeadLens's version, recorded in the files it writes

__all__ = ["Attention", "AttentionModel", "BertEncoder", "EncoderConfig", "HeadLensError",
           "MultiHeadAttention", "load_model", "pick_device"]
