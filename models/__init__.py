"""Attention engines: our from-scratch multi-head attention and networks, and transformers models."""
from .base import AttentionModel
from .errors import HeadLensError
from .files import pick_device
from .loading import load_model
from .mha import MultiHeadAttention
from .result import Attention, Head, head_label
from .run import offers
from .capabilities import DETECTOR, EMBEDDING, VOCABULARY
from .stacks.bert import BertEncoder, EncoderConfig

__version__ = "0.15.0"  # HeadLens's version, recorded in the files it writes

__all__ = ["Attention", "AttentionModel", "BertEncoder", "DETECTOR", "EMBEDDING", "EncoderConfig", "Head",
           "HeadLensError", "MultiHeadAttention", "VOCABULARY", "head_label", "load_model", "offers", "pick_device"]
