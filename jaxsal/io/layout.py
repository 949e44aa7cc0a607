"""Buffers in either layout: (N, 84, 84, 4) or (N, 4, 84, 84) is recognised from its shape and
handed to the model in the model's layout (transposed per chunk, never as a whole copy)."""
from __future__ import annotations

import numpy as np

from jaxsal.checks import looks_channel_first, looks_channel_last

_PERM = {("NHWC", "NCHW"): (0, 3, 1, 2), ("NCHW", "NHWC"): (0, 2, 3, 1)}


def buffer_layout(shape, default: str) -> str:
    """"NCHW" or "NHWC" as the frame-stack shape says; `default` when the shape cannot tell."""
    if looks_channel_first(shape):
        return "NCHW"
    if looks_channel_last(shape):
        return "NHWC"
    return default


def to_nhwc_shape(shape, layout: str) -> tuple:
    return tuple(shape) if layout == "NHWC" else (shape[0], shape[2], shape[3], shape[1])


class Relayout:
    """A source read in another layout: `read` returns chunks transposed to `layout`."""

    def __init__(self, source, src_layout: str, layout: str):
        self.source, self.src_layout, self.layout = source, src_layout, layout
        self._perm = _PERM[(src_layout, layout)]
        if hasattr(source, "actions"):
            self.actions = source.actions
        if hasattr(source, "row_ids"):
            self.row_ids = source.row_ids

    def __len__(self):
        return len(self.source)

    @property
    def shape(self):
        s = self.source.shape
        return (s[0],) + tuple(s[p] for p in self._perm[1:])

    def read(self, a, b):
        return np.ascontiguousarray(np.transpose(self.source.read(a, b), self._perm))

    def fingerprint(self):
        return self.source.fingerprint()

    def describe(self):
        return dict(self.source.describe(), layout=self.src_layout)


def as_layout(source, layout: str):
    """`source` as frames in `layout` (itself when it already is)."""
    have = buffer_layout(source.shape, layout)
    return source if have == layout else Relayout(source, have, layout)
