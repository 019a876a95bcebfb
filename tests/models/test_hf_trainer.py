"""A vitlab model in transformers' `Trainer`: bare, the constructor stops at once with one line naming what to wrap;
wrapped as docs/coming-from-transformers.md shows, Trainer trains it and `vitlab.save` keeps what it trained."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import vitlab

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coming-from-transformers.md"


def _wrapper_snippet() -> str:
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
               if b.startswith("# vitlab in transformers' Trainer")]
    return code


def _args(tmp_path) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4,
                                          learning_rate=1e-2, report_to=[], save_strategy="no", use_cpu=True,
                                          logging_strategy="no", dataloader_num_workers=0)


class _Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"pixel_values": torch.randn(3, 32, 32, generator=g), "labels": i % 3}


def test_bare_model_fails_in_the_constructor_with_one_line(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", depth=1, num_classes=3, image_size=32)
    with pytest.raises(dataclasses.FrozenInstanceError) as err:
        transformers.Trainer(model=model, args=_args(tmp_path))
    message = str(err.value)
    assert "\n" not in message and "wrap the model" in message and "docs/coming-from-transformers.md" in message


def test_documented_wrapper_trains(tmp_path):
    """The page's snippet, its class run as written; Trainer changes the weights and the saved model is them."""
    code = _wrapper_snippet()
    namespace: dict = {}
    exec(compile(code.split("\ntrainer = ")[0], "docs", "exec"), namespace)  # the imports and the wrapper
    assert "vitlab.save(trainer.model.model" in code
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", depth=1, num_classes=3, image_size=32)
    before = model.head.weight.detach().clone()
    trainer = transformers.Trainer(model=namespace["Classifier"](model), args=_args(tmp_path),
                                   train_dataset=_Images())
    trainer.train()
    assert not torch.equal(model.head.weight, before)
    vitlab.save(trainer.model.model, tmp_path / "finetuned.safetensors")
    loaded = vitlab.load(tmp_path / "finetuned.safetensors")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model.eval()(x), rtol=0, atol=0)
