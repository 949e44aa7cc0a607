"""Flax agents with stable layer names, so saliency methods can tap layers by name.

Every Atari network takes a frame stack `(N, 84, 84, C)` NHWC, uint8 or float on the
0-255 pixel scale, and scales it to [0, 1] inside. Layer names are part of the API.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from .errors import AgentInputError


def check_frames(x, height: int | None = 84, width: int | None = 84, channels: int | None = None,
                 name: str = "obs"):
    """Raise a clear error unless x is a batch of NHWC frame stacks of the expected size."""
    shape = tuple(x.shape)
    if len(shape) != 4:
        raise AgentInputError(
            f"{name} must have shape (N, H, W, C) (NHWC frame stacks), got shape {shape}. "
            "Add a batch axis with obs[None] for a single state.")
    n, h, w, c = shape
    if height is not None and (h, w) != (height, width):
        if shape[1] == channels or (h < 16 and w == height):
            raise AgentInputError(
                f"{name} looks channel-first {shape}; this network wants NHWC "
                f"(N, {height}, {width}, C): transpose with obs.transpose(0, 2, 3, 1).")
        raise AgentInputError(f"{name} must be (N, {height}, {width}, C), got {shape}.")
    if channels is not None and c != channels:
        raise AgentInputError(
            f"{name} has {c} channels, the network expects {channels} (shape {shape}). "
            "Is the frame stack channel-first? Use NHWC: obs.transpose(0, 2, 3, 1).")
    if not (jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == jnp.uint8 or x.dtype == jnp.bool_):
        raise AgentInputError(
            f"{name} must be uint8 or float (0-255 pixel scale), got dtype {x.dtype}.")


def scale_pixels(x):
    """uint8 or float frames on the 0-255 scale -> float32 in [0, 1]."""
    return jnp.asarray(x, jnp.float32) / 255.0


class _Norm(nn.Module):
    """Optional LayerNorm (PQN-style stabiliser); identity when disabled."""
    enabled: bool

    @nn.compact
    def __call__(self, x):
        return nn.LayerNorm()(x) if self.enabled else x


def nature_trunk(obs, layer_norm: bool = False):
    """Mnih et al. 2015 conv trunk 32@8x8/4, 64@4x4/2, 64@3x3/1 -> flat (N, 3136).

    Called inside a parent's compact `__call__`, so the layers are named `conv1..3` at the
    top level of the parent's params (no nested trunk scope).
    """
    x = scale_pixels(obs)
    for i, (feat, k, s) in enumerate(((32, 8, 4), (64, 4, 2), (64, 3, 1)), start=1):
        x = nn.Conv(feat, (k, k), (s, s), padding="VALID", name=f"conv{i}")(x)
        x = nn.relu(_Norm(layer_norm, name=f"conv{i}_norm")(x))
    return x.reshape((x.shape[0], -1))


class NatureDQN(nn.Module):
    """Nature-CNN DQN: layers `conv1`, `conv2`, `conv3`, `fc1`, `q`; returns Q `(N, A)`."""
    num_actions: int
    layer_norm: bool = False
    frames: int = 4

    @nn.compact
    def __call__(self, obs):
        check_frames(obs, 84, 84, self.frames)
        x = nature_trunk(obs, self.layer_norm)
        x = nn.relu(_Norm(self.layer_norm, name="fc1_norm")(nn.Dense(512, name="fc1")(x)))
        return nn.Dense(self.num_actions, name="q")(x)


class DuelingDQN(nn.Module):
    """DDDQN of Paper A: Nature trunk, value and advantage streams, Q = V + A - mean(A).

    Returns a dict with `q` (N, A), `value` (N,) and `advantage` (N, A).
    """
    num_actions: int
    layer_norm: bool = False
    frames: int = 4

    @nn.compact
    def __call__(self, obs):
        check_frames(obs, 84, 84, self.frames)
        x = nature_trunk(obs, self.layer_norm)
        a = nn.leaky_relu(_Norm(self.layer_norm, name="adv_fc_norm")(nn.Dense(512, name="adv_fc")(x)))
        a = nn.Dense(self.num_actions, name="advantage")(a)
        v = nn.relu(_Norm(self.layer_norm, name="value_fc_norm")(nn.Dense(512, name="value_fc")(x)))
        v = nn.Dense(1, name="value")(v)[:, 0]
        q = v[:, None] + a - a.mean(axis=-1, keepdims=True)
        return {"q": q, "value": v, "advantage": a}


class ActorCritic(nn.Module):
    """PPO-style actor-critic on the Nature trunk: dict with `logits` (N, A) and `value` (N,)."""
    num_actions: int
    frames: int = 4

    @nn.compact
    def __call__(self, obs):
        check_frames(obs, 84, 84, self.frames)
        x = nature_trunk(obs)
        x = nn.relu(nn.Dense(512, name="fc1")(x))
        logits = nn.Dense(self.num_actions, name="policy")(x)
        value = nn.Dense(1, name="critic")(x)[:, 0]
        return {"logits": logits, "value": value}


class MinAtarDQN(nn.Module):
    """Small CNN for MinAtar (N, 10, 10, C) binary grids: `conv1` 16@3x3, `fc1` 128, `q`."""
    num_actions: int
    channels: int
    layer_norm: bool = True

    @nn.compact
    def __call__(self, obs):
        check_frames(obs, 10, 10, self.channels)
        x = jnp.asarray(obs, jnp.float32)
        x = nn.Conv(16, (3, 3), padding="SAME", name="conv1")(x)
        x = nn.relu(_Norm(self.layer_norm, name="conv1_norm")(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(_Norm(self.layer_norm, name="fc1_norm")(nn.Dense(128, name="fc1")(x)))
        return nn.Dense(self.num_actions, name="q")(x)


class MinAtarDuelingDQN(nn.Module):
    """Paper A's dueling head on the MinAtar trunk: `conv1` 16@3x3, then an advantage stream
    (`adv_fc` 128, leaky ReLU, `advantage` (N, A)) and a value stream (`value_fc` 128, ReLU,
    `value` (N,)), merged as Q = V + A - mean(A) (the layout of DuelingDQN). Returns a dict
    with `q`, `value` and `advantage`."""
    num_actions: int
    channels: int
    layer_norm: bool = True

    @nn.compact
    def __call__(self, obs):
        check_frames(obs, 10, 10, self.channels)
        x = jnp.asarray(obs, jnp.float32)
        x = nn.Conv(16, (3, 3), padding="SAME", name="conv1")(x)
        x = nn.relu(_Norm(self.layer_norm, name="conv1_norm")(x))
        x = x.reshape((x.shape[0], -1))
        a = nn.leaky_relu(_Norm(self.layer_norm, name="adv_fc_norm")(nn.Dense(128, name="adv_fc")(x)))
        a = nn.Dense(self.num_actions, name="advantage")(a)
        v = nn.relu(_Norm(self.layer_norm, name="value_fc_norm")(nn.Dense(128, name="value_fc")(x)))
        v = nn.Dense(1, name="value")(v)[:, 0]
        q = v[:, None] + a - a.mean(axis=-1, keepdims=True)
        return {"q": q, "value": v, "advantage": a}


class MinAtarActorCritic(nn.Module):
    """MinAtar actor-critic: `conv1` 16@3x3, `fc1` 128, `policy` logits (N, A), `critic` value (N,)."""
    num_actions: int
    channels: int

    @nn.compact
    def __call__(self, obs):
        check_frames(obs, 10, 10, self.channels)
        x = nn.relu(nn.Conv(16, (3, 3), padding="SAME", name="conv1")(jnp.asarray(obs, jnp.float32)))
        x = nn.relu(nn.Dense(128, name="fc1")(x.reshape((x.shape[0], -1))))
        return {"logits": nn.Dense(self.num_actions, name="policy")(x),
                "value": nn.Dense(1, name="critic")(x)[:, 0]}


class _TemporalAttention(nn.Module):
    """Soft attention over time: e_t = tanh(Dense1(x_t)), alpha = softmax_t(e)."""

    @nn.compact
    def __call__(self, x):  # x: (N, T, F)
        e = jnp.tanh(nn.Dense(1, name="score")(x))[..., 0]
        return nn.softmax(e, axis=1)


class _BiLSTM(nn.Module):
    """Bidirectional LSTM with sum merge of the two directions."""
    features: int

    @nn.compact
    def __call__(self, x):
        fwd = nn.RNN(nn.OptimizedLSTMCell(self.features), name="forward")(x)
        bwd = nn.RNN(nn.OptimizedLSTMCell(self.features), reverse=True, keep_order=True,
                     name="backward")(x)
        return fwd + bwd


class SplitAttentionDQN(nn.Module):
    """Paper A's split-attention agent over a stack of `frames` single frames.

    Per frame: shared Nature trunk + `fc1` 512. Two streams (value, advantage), each two
    bidirectional LSTM layers (sum merge), a per-step Dense head and its own temporal soft
    attention; per-step dueling merge, attention-weighted sum over time, final Dense(|A|).
    Returns dict `q`, `value`, `advantage`, `value_attention`, `advantage_attention`.
    """
    num_actions: int
    frames: int = 10
    lstm_features: int = 512

    @nn.compact
    def __call__(self, obs):
        check_frames(obs, 84, 84, self.frames)
        n, t = obs.shape[0], self.frames
        # (N, H, W, T) -> (N*T, H, W, 1): every frame through the shared CNN.
        single = jnp.moveaxis(obs, -1, 1).reshape((n * t, 84, 84, 1))
        x = nature_trunk(single)
        x = nn.relu(nn.Dense(512, name="fc1")(x)).reshape((n, t, 512))

        def stream(prefix, out_dim):
            h = _BiLSTM(self.lstm_features, name=f"{prefix}_lstm1")(x)
            h = _BiLSTM(self.lstm_features, name=f"{prefix}_lstm2")(h)
            per_step = nn.Dense(out_dim, name=f"{prefix}_head")(h)          # (N, T, out)
            alpha = _TemporalAttention(name=f"{prefix}_attention")(h)        # (N, T)
            return per_step, alpha

        v, v_alpha = stream("value", 1)
        a, a_alpha = stream("advantage", self.num_actions)
        q_steps = v * v_alpha[..., None] + (a - a.mean(-1, keepdims=True)) * a_alpha[..., None]
        q = nn.Dense(self.num_actions, name="q")(q_steps.sum(axis=1))
        value = (v[..., 0] * v_alpha).sum(axis=1)
        advantage = (a * a_alpha[..., None]).sum(axis=1)
        return {"q": q, "value": value, "advantage": advantage,
                "value_attention": v_alpha, "advantage_attention": a_alpha}
