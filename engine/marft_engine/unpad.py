"""Training and forward passes without padding: the trunk over a micro-batch's real tokens only.

A micro-batch of B rows right-padded to its longest row, T, costs B x T tokens in every linear
layer, norm and MLP of the trunk, though only its N real tokens matter (the speed bench's PPO
micro-batch of the demo's shapes: 912 positions for 768 tokens). Here the trunk runs on the N tokens
laid end to end as one row [1, N], each at its own position. Only attention, where rows must not see
each other, puts them back into the padded [B, T] layout and out again (`Layout.pad`,
`Layout.unpad`, called by the engine's attention override, precision.py). The final hidden state
returns in the padded layout [B, T, d], zero at padding, so what follows the trunk (LM head, losses,
value heads) is unchanged, and so are the results up to the rounding of products over other row
counts (tests).

It applies to a CPU base (which attends through the engine's override, precision.place) whose layers
all attend causally over the whole row: a sliding-window layer would need its own mask, which the
padded layout's mask here is not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

ENABLED = True  # False: padded passes, as before (bench/train_ab.py switches it)


@dataclass(frozen=True)
class Layout:
    """Where the N real tokens of a [B, T] micro-batch sit."""

    at: torch.Tensor  # [N] each real token's flat position b * T + t in the padded layout
    B: int
    T: int
    lengths: list[int]  # [B] each row's real tokens (a row's tokens are consecutive in [1, N])
    mask: torch.Tensor  # [B, 1, T, T] bool, True = attend: causal, and real keys only

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[1, H, N, D] -> [B, H, T, D], zero at padding."""
        _, H, N, D = x.shape
        flat = x.new_zeros(self.B * self.T, H, D).index_put((self.at,), x[0].transpose(0, 1))  # [BT, H, D]
        return flat.view(self.B, self.T, H, D).transpose(1, 2)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] -> [1, N, ...]: the real tokens' rows."""
        return x.reshape(self.B * self.T, *x.shape[2:])[self.at][None]


_layout: Layout | None = None  # the pass in progress's (the engine runs one pass at a time)


def layout() -> Layout | None:
    return _layout


@contextlib.contextmanager
def _laid_out(lay: Layout) -> Iterator[None]:
    global _layout
    _layout = lay
    try:
        yield
    finally:
        _layout = None


def applies(config: PretrainedConfig) -> bool:
    """Whether every layer of a model with this config attends causally over the whole row."""
    kinds = getattr(config, "layer_types", None)
    if kinds is not None:
        return all(k == "full_attention" for k in kinds)
    return getattr(config, "sliding_window", None) is None


def trunk(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The trunk's last hidden state [B, T, d] of right-padded ids and their mask [B, T], computed
    over the real tokens only (module docstring); the plain padded pass where no row is padded."""
    B, T = ids.shape
    keep = mask.bool()  # [B, T]
    if not ENABLED or bool(keep.all()):
        return model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    at = keep.view(-1).nonzero().squeeze(1)  # [N]
    positions = torch.arange(T, device=ids.device).expand(B, T)  # [B, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()  # [T, T]
    attend = causal[None, None] & keep[:, None, None, :]  # [B, 1, T, T]
    lay = Layout(at=at, B=B, T=T, lengths=keep.sum(1).tolist(), mask=attend)
    with _laid_out(lay):
        # A 4-D mask goes to the attention layers as it is (transformers builds none of its own)
        hidden = model(
            input_ids=ids.view(-1)[at][None],  # [1, N]
            position_ids=positions.reshape(-1)[at][None],  # [1, N]
            attention_mask=attend,
            use_cache=False,
        ).last_hidden_state  # [1, N, d]
    d = hidden.shape[-1]
    return hidden.new_zeros(B * T, d).index_put((at,), hidden[0]).view(B, T, d)
