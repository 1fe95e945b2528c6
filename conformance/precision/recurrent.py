"""Float64 forms of oneDNN's recurrent layer, for its shadows.

On the CPU a float32 ``nn.LSTM`` runs as oneDNN's ``mkldnn_rnn_layer`` (one layer, one direction a call) and its
backward as ``mkldnn_rnn_layer_backward``; neither has a float64 kernel (a float64 call only raises), and the float64
reference run takes ATen's own cell-by-cell ops instead, so neither has a counterpart there. Their shadows are the
LSTM written out step by step in float64 (:func:`math_lstm_layer`) and its gradients by autograd through that
(:func:`math_lstm_layer_grads`). Another cell than the LSTM and packed sequences are not covered
(:class:`blocks.UnshadowedError`). Pure functions; thread-safe.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from .argtree import named_arguments
from .blocks import UnshadowedError


def math_lstm_layer(input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse=False):
    """``(output, h, c)`` of one LSTM layer in one direction, written out step by step (gates in torch's order
    i, f, g, o; ``input`` time-major ``[T, B, I]``, ``hx``/``cx`` ``[B, H]``; ``reverse``: from the last step to
    the first, each output at its own time index; ``b_ih``/``b_hh`` None without biases): what oneDNN's
    ``mkldnn_rnn_layer`` computes on the CPU, in the arguments' dtype."""
    x = input @ w_ih.transpose(0, 1)
    if b_ih is not None:
        x = x + b_ih + b_hh
    h, c = hx, cx
    outs = [None] * input.size(0)
    for t in (range(input.size(0) - 1, -1, -1) if reverse else range(input.size(0))):
        i, f, g, o = (x[t] + h @ w_hh.transpose(0, 1)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs[t] = h
    return torch.stack(outs), h, c


def _lstm_arguments(func, name, args, kwargs) -> Tuple[Dict[str, Any], bool]:
    """The layer's arguments by name and whether it has biases. Raises :class:`UnshadowedError` for what the written-out
    LSTM does not cover (another cell than the LSTM, packed sequences)."""
    n = named_arguments(func, args, kwargs)
    if n.get("mode") != 2 or n.get("batch_sizes"):
        raise UnshadowedError(f"{name} with mode {n.get('mode')} or packed sequences has no float64 form here")
    return n, bool(n.get("has_biases", True))


def lstm_layer_call(func, name, args, kwargs) -> Tuple[Any, tuple, dict]:
    """``(fn, args, kwargs)`` standing for ``mkldnn_rnn_layer`` (outputs 0-2: output, h, c): :func:`math_lstm_layer`.
    Raises :class:`UnshadowedError` as :func:`_lstm_arguments`."""
    n, biased = _lstm_arguments(func, name, args, kwargs)
    return (math_lstm_layer, (n["input"], n["weight0"], n["weight1"], n["weight2"] if biased else None,
                              n["weight3"] if biased else None, n["hx_"], n["cx_"]), {"reverse": bool(n["reverse"])})


def math_lstm_layer_grads(input, w_ih, w_hh, b_ih, b_hh, hx, cx, grad_output, grad_hy, grad_cy, reverse=False):
    """The seven gradients ``mkldnn_rnn_layer_backward`` returns (input, ``w_ih``, ``w_hh``, ``b_ih``, ``b_hh``, hx,
    cx) for the incoming ``grad_output``, ``grad_hy`` and ``grad_cy`` (any may be None: no gradient there), by
    autograd through :func:`math_lstm_layer` in the arguments' dtype. Without biases (``b_ih``/``b_hh`` None) the
    bias gradients are those of zero biases, which the kernel computes too (ATen discards them). Runs autograd
    whatever the caller's grad mode (the shadows are computed under ``no_grad``); touches no argument's ``.grad``."""
    if b_ih is None:
        b_ih = b_hh = w_ih.new_zeros(w_ih.shape[0])
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (input, w_ih, w_hh, b_ih, b_hh, hx, cx)]
        outs = math_lstm_layer(*leaves, reverse=reverse)
        pairs = [(o, g) for o, g in zip(outs, (grad_output, grad_hy, grad_cy)) if g is not None]
        got = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    return tuple(torch.zeros_like(t) if d is None else d for t, d in zip(leaves, got))


def lstm_layer_backward_call(func, name, args, kwargs) -> Tuple[Any, tuple, dict]:
    """``(fn, args, kwargs)`` standing for ``mkldnn_rnn_layer_backward`` (its seven gradients):
    :func:`math_lstm_layer_grads`. Raises :class:`UnshadowedError` as :func:`_lstm_arguments`."""
    n, biased = _lstm_arguments(func, name, args, kwargs)
    return (math_lstm_layer_grads, (n["input"], n["weight1"], n["weight2"], n["weight3"] if biased else None,
                                    n["weight4"] if biased else None, n["hx_"], n["cx_tmp"], n.get("grad_output"),
                                    n.get("grad_hy"), n.get("grad_cy")), {"reverse": bool(n["reverse"])})
