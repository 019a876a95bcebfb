"""Images decoded as vitlab reads them (vitlab.data.sources.decode_rgb): 16-bit and floating-point images are scaled
to 8 bits, not clipped or saturated, also on their way through vitlab.transforms; a float image outside [0, 1] is
refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.data.sources import decode_rgb


def test_a_16_bit_png_is_scaled_to_8_bits_not_saturated(tmp_path):
    grey = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)  # 0 … 65520
    Image.fromarray(grey).save(tmp_path / "g16.png")
    expected = ((grey.astype(np.int64) * 255 + 32767) // 65535).astype(np.uint8)
    decoded = np.asarray(decode_rgb(tmp_path / "g16.png"))
    assert decoded.shape == (64, 64, 3) and all(np.array_equal(decoded[..., c], expected) for c in range(3))
    assert len(np.unique(decoded)) == 256  # the whole range, not 0 … 255 then white
    with Image.open(tmp_path / "g16.png") as img:  # a PIL image handed to vitlab.transforms goes the same way
        model = vitlab.create_model("ViT-Ti/16", num_classes=2, image_size=64, depth=1)
        got = vitlab.transforms(model)(img)
    want = (torch.from_numpy(expected).float() / 255 - 0.5) / 0.5
    assert torch.allclose(got[0], want, atol=1e-6)


def test_a_float_tiff_in_0_1_is_scaled_and_one_outside_is_refused(tmp_path):
    ramp = np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32)
    Image.fromarray(ramp).save(tmp_path / "f.tif")
    decoded = np.asarray(decode_rgb(tmp_path / "f.tif"))
    assert np.array_equal(decoded[..., 1], np.round(ramp.astype(np.float64) * 255).astype(np.uint8))
    assert decoded.max() == 255  # was black: values 0 and 1 of 255
    Image.fromarray(np.full((8, 8), 3.5, np.float32)).save(tmp_path / "hot.tif")
    with pytest.raises(ValueError) as refused:
        decode_rgb(tmp_path / "hot.tif")
    assert str(refused.value) == ("a floating-point image with values from 3.5 to 3.5: vitlab reads float images in "
                                  "[0, 1]; scale it to [0, 1] or save it as 8-bit")
