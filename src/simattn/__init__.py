"""simattn: softmax-free vision transformers (SimA and its peers) as PyTorch modules and timm models.

Importing the package registers its attention kinds and its models with timm (``timm.create_model``);
``simattn.create_model`` is timm's with one-line errors and the pretrained tags' weights resolved as every command
resolves them.
"""
from . import attention, models  # noqa: F401
from .attention import create_attention, get_attention_class, list_attentions  # noqa: F401
from .models import create_model, list_models  # noqa: F401

__version__ = "0.1.0"
