"""The module base of the kinds on the token grid (``GridAttention``) and the token↔image layouts of ``grid.py``:
every kind that uses the grid derives from the base and takes ``num_prefix_tokens``; a token count that fits no grid
is a one-line ValueError naming the kind; the prefix tokens pass the grid's layouts, convolutions and encodings
unchanged."""
import pytest
import torch

from simattn.attention import GridAttention, create_attention, get_attention_class, list_attentions
from simattn.attention._registry import constructor_options
from simattn.attention.base import GridReducedAttention
from simattn.attention.grid import (add_heads_image, add_to_grid, head_images, head_tokens, heads_image,
                                    heads_tokens, image_tokens, tokens_image)

pytestmark = pytest.mark.usefixtures("one_thread")

GRID_KINDS = sorted(k for k in list_attentions() if issubclass(get_attention_class(k), GridAttention))
#: options under which a kind works on the grid at all (CosFormer only when it re-weights)
ON_GRID = {"cosformer": dict(reweight=True)}


def test_every_kind_on_the_grid_derives_from_the_one_base():
    on_grid = sorted(k for k in list_attentions() if get_attention_class(k).uses_grid)
    assert on_grid == GRID_KINDS
    assert {"agent", "soft", "nystrom", "linformer", "cosformer", "flatten", "inline", "slab", "polaformer"} \
        <= set(GRID_KINDS)
    for kind in GRID_KINDS:
        cls = get_attention_class(kind)
        assert cls.attend_uses_grid and "num_prefix_tokens" in constructor_options(cls), kind
        assert cls.takes_reduction_ratio == issubclass(cls, GridReducedAttention), kind
        assert ("ratio" in constructor_options(cls)) == cls.takes_reduction_ratio, kind


@pytest.mark.parametrize("kind", GRID_KINDS)
def test_a_token_count_that_fits_no_grid_is_one_line_naming_the_kind(kind):
    m = create_attention(kind, 16, num_heads=2, **ON_GRID.get(kind, {}))
    with pytest.raises(ValueError) as err:
        m(torch.randn(1, 18, 16))  # neither 18 nor 17 grid tokens make a square
    assert str(err.value) == f"{kind}: cannot infer a square token grid from N=18; pass grid_size=(H, W)"
    with pytest.raises(ValueError, match=rf"^{kind}: 18 tokens do not fit grid 4x4 with 1 prefix tokens$"):
        create_attention(kind, 16, num_heads=2, num_prefix_tokens=1, **ON_GRID.get(kind, {}))(
            torch.randn(1, 18, 16), grid_size=(4, 4))
    with pytest.raises(ValueError, match=r"^\w+Attention: num_prefix_tokens=-1; allowed: an integer >= 0$"):
        create_attention(kind, 16, num_heads=2, num_prefix_tokens=-1)


def test_the_layouts_go_back_and_leave_the_prefix_tokens_unchanged():
    B, H, d, grid, prefix = 2, 3, 4, (2, 5), 2
    x = torch.randn(B, H, prefix + grid[0] * grid[1], d)
    images = head_images(x, grid, prefix)
    assert images.shape == (B * H, d, *grid) and torch.equal(images[4, :, 1, 3], x[1, 1, prefix + 8])
    assert torch.equal(head_tokens(images, H), x[:, :, prefix:])
    image = heads_image(x, grid, prefix)
    assert image.shape == (B, H * d, *grid) and torch.equal(image[1, d:2 * d, 1, 0], x[1, 1, prefix + 5])
    assert torch.equal(heads_tokens(image, H), x[:, :, prefix:])
    tokens = torch.randn(B, grid[0] * grid[1], 6)
    assert torch.equal(image_tokens(tokens_image(tokens, grid)), tokens)
    for added in (add_to_grid(x, torch.ones(B, H, grid[0] * grid[1], d), prefix),
                  add_heads_image(x, torch.ones_like(image), prefix)):
        assert torch.equal(added[:, :, :prefix], x[:, :, :prefix])
        assert torch.equal(added[:, :, prefix:], x[:, :, prefix:] + 1)


@pytest.mark.parametrize("kind", ["flatten", "slab", "polaformer"])
def test_the_grid_linear_pieces_leave_the_prefix_tokens_unchanged(kind):
    m = create_attention(kind, 16, num_heads=2, pos_grid=(3, 3), num_prefix_tokens=1)
    with torch.no_grad():
        m.positional_encoding.normal_()
    k, v, out = (torch.randn(2, 2, 1 + 3 * 3, 8) for _ in range(3))
    for grid in ((3, 3), (4, 2)):  # the encoding's own grid, and one it is resampled to
        n = 1 + grid[0] * grid[1]
        keyed, conved = m.add_key_position(k[:, :, :n], grid, 1), m.add_value_conv(out[:, :, :n], v[:, :, :n], grid, 1)
        assert torch.equal(keyed[:, :, :1], k[:, :, :1]) and not torch.equal(keyed[:, :, 1:], k[:, :, 1:n])
        assert torch.equal(conved[:, :, :1], out[:, :, :1]) and not torch.equal(conved[:, :, 1:], out[:, :, 1:n])
