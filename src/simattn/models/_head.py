"""The classifier head shared by the token models that are not timm's own (:class:`~._pyramid.PyramidTransformer`,
:class:`~.sima_xcit.XCiTBackbone`): pool the normalized tokens of ``forward_features``, dropout, linear."""
import torch
from torch import nn

__all__ = ["TokenPoolHead"]


class TokenPoolHead:
    """timm's ``get_classifier`` / ``forward_head(x, pre_logits=...)`` / ``forward`` for an ``nn.Module`` with
    ``forward_features`` (→ tokens (B, P + N, C), the P prefix tokens first), ``global_pool`` ('token': the first
    token, 'avg': the mean of the other tokens, '': no pooling), ``num_prefix_tokens``, ``head_drop`` and ``head``.
    """

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens:].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
