"""Observation layouts: Dicts flattened once at the edge, images kept as uint8, and the
encoders read back exactly what was packed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.errors import EnvSpecError
from rlfleet.nn.encoders import (
    FlatEncoder,
    GridEncoder,
    ImageEncoder,
    MixedEncoder,
    make_encoder,
)
from rlfleet.nn.obs import ObsLayout, grid_channels_first, is_binary_grid_space


def test_nested_dict_is_packed_into_one_float_row() -> None:
    space = spaces.Dict(
        {
            "a": spaces.Box(-1, 1, (2,), np.float32),
            "b": spaces.Dict({"k": spaces.Discrete(3, start=1), "m": spaces.MultiBinary(2)}),
            "c": spaces.MultiDiscrete([2, 3]),
            "action_mask": spaces.MultiBinary(4),
        }
    )
    layout = ObsLayout(space)
    assert layout.kind == "packed"
    assert layout.mask_in_obs
    assert layout.shape == (2 + 3 + 2 + 5,)
    obs = {
        "a": np.array([[0.5, -0.5]], np.float32),
        "b": {"k": np.array([3]), "m": np.array([[1, 0]], np.int8)},
        "c": np.array([[1, 0]]),
        "action_mask": np.ones((1, 4), np.int8),
    }
    row = layout.to_tensor(obs)
    expected = [0.5, -0.5, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0]
    torch.testing.assert_close(row, torch.tensor([expected], dtype=torch.float32))
    assert isinstance(make_encoder(layout), FlatEncoder)


def test_dict_with_an_image_stays_uint8_and_unpacks_exactly() -> None:
    space = spaces.Dict(
        {
            "vec": spaces.Box(-10, 10, (3,), np.float32),
            "img": spaces.Box(0, 255, (36, 36, 1), np.uint8),
        }
    )
    layout = ObsLayout(space)
    assert layout.dtype == torch.uint8
    assert layout.shape[0] % 4 == 0
    vec = np.array([[1.5, -2.25, 7.0]], np.float32)
    img = np.random.default_rng(0).integers(0, 256, (1, 36, 36, 1), dtype=np.uint8)
    row = layout.to_tensor({"vec": vec, "img": img})
    encoder = make_encoder(layout)
    assert isinstance(encoder, MixedEncoder)
    floats = row[:, : encoder.num_float_bytes].view(torch.float32)
    torch.testing.assert_close(floats, torch.from_numpy(vec))
    start, stop = encoder.slices[0]
    np.testing.assert_array_equal(row[:, start:stop].numpy().reshape(1, 36, 36, 1), img)
    assert encoder(row).shape == (1, 3 + 512)


def test_images_are_stored_as_uint8_in_both_channel_orders() -> None:
    for shape in ((36, 36, 3), (4, 84, 84)):
        layout = ObsLayout(spaces.Box(0, 255, shape, np.uint8))
        assert layout.kind == "image"
        assert layout.dtype == torch.uint8
        encoder = make_encoder(layout, "nature")
        assert isinstance(encoder, ImageEncoder)
        batch = torch.zeros((2, *shape), dtype=torch.uint8)
        assert encoder(batch).shape == (2, 512)


def test_binary_grids_are_float_vectors_fed_to_a_cnn_channels_last() -> None:
    space = spaces.Box(0, 1, (10, 10, 4), np.bool_)
    assert is_binary_grid_space(space)
    assert not is_binary_grid_space(spaces.Box(0, 1, (10, 4), np.bool_))
    assert not is_binary_grid_space(spaces.Box(0.0, 1.0, (10, 10, 4), np.float32))
    layout = ObsLayout(space)
    assert (layout.kind, layout.dtype, layout.shape) == ("vector", torch.float32, (10, 10, 4))
    obs = np.zeros((2, 10, 10, 4), np.bool_)
    obs[1, 3, 5, 2] = True
    stored = layout.to_tensor(obs)
    assert stored.dtype == torch.float32
    assert float(stored.sum()) == 1.0
    encoder = make_encoder(layout, "minatar")
    assert isinstance(encoder, GridEncoder)
    assert not encoder.channels_first
    assert encoder.cnn.convs[0].in_channels == 4
    assert encoder(stored).shape == (2, 128)
    # A grid with as many channels as rows (MinAtar's Seaquest) is still channels last; a
    # strictly smaller first dim is channels first.
    assert not grid_channels_first((10, 10, 10))
    assert grid_channels_first((4, 10, 10))
    assert (
        make_encoder(ObsLayout(spaces.Box(0, 1, (4, 10, 10), np.bool_)), "minatar")
        .cnn.convs[0]
        .in_channels
        == 4
    )


def test_unsupported_dict_part_is_named() -> None:
    space = spaces.Dict({"ok": spaces.Discrete(2), "bad": spaces.Text(5)})
    with pytest.raises(EnvSpecError, match=r"observation\['bad'\].*Text"):
        ObsLayout(space)
