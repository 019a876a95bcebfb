"""hf-hub:owner/name through huggingface_hub, against a Hugging Face cache written here, with HF_HUB_OFFLINE=1:
the model loads and computes what transformers computes from the same folder; a missing repo is one line."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.errors import WeightsError

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A HF hub cache holding `tiny-owner/tiny-vit` at COMMIT, in huggingface_hub's layout
    (models--owner--name/refs/main -> snapshots/<commit>/<files>); offline."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--tiny-owner--tiny-vit" / "snapshots" / COMMIT
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64, layer_norm_eps=1e-6,
                                    id2label={0: "cat", 1: "dog", 2: "bird"}, label2id={"cat": 0, "dog": 1, "bird": 2})
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(snapshot, safe_serialization=True)
    (cache / "models--tiny-owner--tiny-vit" / "refs").mkdir()
    (cache / "models--tiny-owner--tiny-vit" / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "vitlab-cache"))
    return model


def test_hub_id_loads_from_the_hf_cache_offline(hf_cache):
    model = vitlab.load("hf-hub:tiny-owner/tiny-vit")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_cache(pixel_values=x).logits
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
    assert model.class_names == ["cat", "dog", "bird"]
    assert model.hub_entry["name"] == "hf-hub:tiny-owner/tiny-vit"


def test_hub_id_as_pretrained_tag_and_as_a_weights_path(hf_cache):
    from vitlab.weights.locate import locate as resolve_weights

    folder = resolve_weights("hf-hub:tiny-owner/tiny-vit")
    assert folder.name == COMMIT and (folder / "model.safetensors").is_file()
    model = vitlab.load("ViT-Ti/16", pretrained="hf-hub:tiny-owner/tiny-vit", num_classes=5)
    assert model.config.num_classes == 5 and model.config.width == 32


def test_missing_repo_offline_names_the_command(hf_cache):
    with pytest.raises(WeightsError) as err:
        vitlab.load("hf-hub:google/vit-base-patch16-224")
    msg = str(err.value)
    assert "config.json not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading" in msg
    assert "`vitlab download hf-hub:google/vit-base-patch16-224`" in msg and "\n" not in msg


def test_hugging_face_hub_without_dns_reads_the_cache_at_once(hf_cache, monkeypatch):
    """huggingface_hub retries an unresolvable host 5 times (~25 s) before its cache; one lookup decides it."""
    import socket

    import vitlab
    from vitlab.errors import WeightsError

    # hf_cache: the cached tiny-owner/tiny-vit repository
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # no proxy: the hub's own name must resolve
    lookups = []

    def no_dns(host, *args, **kwargs):
        lookups.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    assert vitlab.load("hf-hub:tiny-owner/tiny-vit").class_names == ["cat", "dog", "bird"]  # from the cache
    with pytest.raises(WeightsError) as err:
        vitlab.load("hf-hub:google/vit-base-patch16-224")
    assert str(err.value) == ("hf-hub:google/vit-base-patch16-224: config.json not in the Hugging Face cache and "
                              "huggingface.co does not resolve (offline?); run `vitlab download "
                              "hf-hub:google/vit-base-patch16-224` where the network is reachable")
    assert set(lookups) == {"huggingface.co"} and len(lookups) <= 4  # no retries: one lookup per load
