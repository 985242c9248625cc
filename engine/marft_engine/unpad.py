"""Passes without padding: the trunk over a micro-batch's or a prefill's real tokens only.

A micro-batch of B rows right-padded to its longest row, T, costs B x T tokens in every linear
layer, norm and MLP of the trunk, though only its N real tokens matter (the speed bench's PPO
micro-batch of the demo's shapes: 912 positions for 768 tokens). Here the trunk runs on the N tokens
laid end to end as one row [1, N], each at its own position. Only attention, where rows must not see
each other, puts them back into the padded [B, T] layout and out again (`Layout.pad`,
`Layout.unpad`, called by the engine's attention override, precision.py). The final hidden state
returns in the padded layout [B, T, d], zero at padding, so what follows the trunk (LM head, losses,
value heads) is unchanged, and so are the results up to the rounding of products over other row
counts (tests).

The sampler's prefill does the same for its left-padded prompts (`prefill`): its new keys and
values go into the padded KV cache the decode steps read (`PaddingCache`), and the head runs on each
row's last token. A rollout's later agents read the earlier answers, so prompts admitted together
differ in length by hundreds of tokens.

It applies to a CPU base (which attends through the engine's override, precision.place) whose layers
all attend causally over the whole row: a sliding-window layer would need its own mask, which the
padded layout's mask here is not. `MARFT_UNPAD=0` in the environment turns it off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig

ENABLED = (
    os.environ.get("MARFT_UNPAD", "1") != "0"
)  # "0": padded passes, as before; bench/unpad_ab.py flips it


@dataclass(frozen=True)
class Layout:
    """Where the N real tokens of a [B, T] micro-batch sit."""

    at: torch.Tensor  # [N] each real token's flat position b * T + t in the padded layout
    B: int
    T: int
    lengths: list[int]  # [B] each row's real tokens (a row's tokens are consecutive in [1, N])
    rows: torch.Tensor  # [N] each real token's row
    mask: torch.Tensor  # [B, 1, T, L] bool, True = attend: causal, and real keys only

    @staticmethod
    def of(keep: torch.Tensor, mask: torch.Tensor) -> Layout:
        """The layout of the real tokens keep [B, T] (bool) under the attention mask [B, 1, T, L]."""
        B, T = keep.shape
        at = keep.view(-1).nonzero().squeeze(1)  # [N]
        return Layout(at=at, B=B, T=T, lengths=keep.sum(1).tolist(), rows=at // T, mask=mask)

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
def laid_out(lay: Layout) -> Iterator[None]:
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
    positions = torch.arange(T, device=ids.device).expand(B, T)  # [B, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()  # [T, T]
    attend = causal[None, None] & keep[:, None, None, :]  # [B, 1, T, T]
    lay = Layout.of(keep, attend)
    at = lay.at
    with laid_out(lay):
        # A 4-D mask goes to the attention layers as it is (transformers builds none of its own)
        hidden = model(
            input_ids=ids.view(-1)[at][None],  # [1, N]
            position_ids=positions.reshape(-1)[at][None],  # [1, N]
            attention_mask=attend,
            use_cache=False,
        ).last_hidden_state  # [1, N, d]
    d = hidden.shape[-1]
    return hidden.new_zeros(B * T, d).index_put((at,), hidden[0]).view(B, T, d)


class PaddingCache(DynamicCache):
    """A KV cache that a prefill over real tokens only (`prefill`) writes in the padded
    layout: each layer's new keys and values [1, H, N, D] go into their rows and columns first."""

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: object,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if _layout is not None and key_states.shape[0] != _layout.B:
            key_states, value_states = _layout.pad(key_states), _layout.pad(value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def prefill(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor
) -> tuple[Layout, dict[str, torch.Tensor], torch.Tensor] | None:
    """A left-padded prefill after C cached columns as a pass over its real tokens only: ids and
    pos [P, S] (new tokens, each row's right-aligned), mask [P, C + S] (1 = a real column). Returns
    (the layout, the pass's input_ids and position_ids [1, N] and its attention_mask
    [P, 1, S, C + S], the index [P] of each row's last token among the N), or None where no row is
    padded or it does not apply to the model (module docstring). Run the pass with a `PaddingCache`
    within `laid_out(layout)`."""
    P, S = ids.shape
    keep = mask[:, -S:].bool()  # [P, S]
    on_cpu = next(model.parameters()).device.type == "cpu"
    if not ENABLED or not on_cpu or not applies(model.config) or bool(keep.all()):
        return None
    C = mask.shape[1] - S
    real = mask.bool()[:, None, None, :]  # [P, 1, 1, C + S]
    cols = torch.arange(C + S, device=ids.device)  # [C + S]
    at_or_before = cols[None, :] <= (C + torch.arange(S, device=ids.device))[:, None]  # [S, C + S]
    own = cols[None, :] == (C + torch.arange(S, device=ids.device))[:, None]  # [S, C + S]
    # A padding query attends its own (zero) column too, so no row of scores is all masked
    attend = (real & at_or_before) | own  # [P, 1, S, C + S]
    lay = Layout.of(keep, attend)
    kw = {
        "input_ids": ids.view(-1)[lay.at][None],
        "position_ids": pos.reshape(-1)[lay.at][None],
        "attention_mask": attend,
    }
    return lay, kw, torch.tensor(lay.lengths, device=ids.device).cumsum(0) - 1
