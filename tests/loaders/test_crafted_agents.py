"""Crafted and damaged agents, through every way an agent enters jaxsal: the loaders' checkpoint files
(CleanRL JAX, flax msgpack, torch state_dicts, SBX), `--agent FILE.py:FUNCTION`, agent cards and their
parameter files. Each is one clear error naming the file, what is wrong and the fix (exit 2 through the
command line, nothing written), never a traceback, a MemoryError or an agent that computes something else.
Each case says what it did before."""
from __future__ import annotations

import os

import flax.serialization
import jax
import msgpack
import numpy as np
import pytest

from jaxsal.loaders import LoaderError, flax_msgpack, load_file
from tests._support import foreign_agents as F


@pytest.fixture(scope="module")
def dqn(tmp_path_factory):
    """CleanRL's dqn_atari_jax QNetwork, its params as a numpy state dict, and its .cleanrl_model file."""
    q = F.QNetwork(action_dim=4)
    params = jax.tree.map(np.asarray, flax.serialization.to_state_dict(q.init(jax.random.PRNGKey(1),
                                                                              F.atari_nchw(1))))
    path = tmp_path_factory.mktemp("dqn") / "good.cleanrl_model"
    path.write_bytes(flax.serialization.msgpack_serialize(params))
    return q, params, path


def _msgpack(tree) -> bytes:
    """`tree` as flax writes it (arrays as msgpack extensions), without flax's tree_map, which would refuse the
    crafted trees below (names that are not all strings)."""
    return msgpack.packb(tree, default=flax.serialization._msgpack_ext_pack, strict_types=True)


def _kernel(params, value):
    """A copy of the params with Dense_1's kernel replaced."""
    return {"params": {**params["params"], "Dense_1": {**params["params"]["Dense_1"], "kernel": value}}}


def test_crafted_cleanrl_and_flax_parameter_trees(tmp_path, dqn):
    """A float128 kernel (before: "internal error TypeError: Error interpreting argument to stage as a JAX value"),
    a float64 kernel holding 1e300 (before: loaded, and explained as inf/NaN maps with exit 0: JAX computes in
    float32), and a bytes name beside the string ones (before: "internal error ValueError: Comparator raised
    exception while sorting pytree dictionary keys"): one LoaderError naming the file, through load_file and
    flax_msgpack."""
    q, params, _ = dqn
    kernel = params["params"]["Dense_1"]["kernel"]
    big = kernel.astype(np.float64)
    big[0, 0] = 1e300
    mixed = {"params": {**params["params"], b"Dense_2": {"kernel": np.zeros(3, np.float32)}}}
    cases = {"float128": (_kernel(params, kernel.astype(np.longdouble)), r"Dense_1.*kernel.* dtype float128, which "
                                                                         "JAX cannot compute in"),
             "float64 1e300": (_kernel(params, big), r"Dense_1.*kernel.* beyond float32's range.*earlier checkpoint"),
             "bytes name": (mixed, "names are not all strings")}
    for name, (tree, says) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.cleanrl_model"
        path.write_bytes(_msgpack(tree))
        for load in (load_file, lambda p: flax_msgpack(p, q, (4, 84, 84), layout="NCHW")):
            with pytest.raises(LoaderError, match=says) as e:
                load(path)
            assert str(path) in str(e.value) and "\n" not in str(e.value), name
    path = tmp_path / "float64.cleanrl_model"  # a float64 kernel of ordinary values still loads
    path.write_bytes(_msgpack(_kernel(params, kernel.astype(np.float64))))
    assert load_file(path).num_actions == 4


def test_an_agent_file_that_is_a_pipe_or_a_link_to_nothing_says_so(tmp_path, dqn):
    """A FIFO and a symbolic link looping on itself both said "does not exist" (the FIFO does)."""
    os.mkfifo(tmp_path / "pipe.cleanrl_model")
    (tmp_path / "loop.cleanrl_model").symlink_to(tmp_path / "loop.cleanrl_model")
    for name, says in {"pipe": "is not a regular file", "loop": "is a symbolic link to nothing"}.items():
        with pytest.raises(LoaderError, match=f"{name}.cleanrl_model {says}.*give the checkpoint file itself"):
            load_file(tmp_path / f"{name}.cleanrl_model")
