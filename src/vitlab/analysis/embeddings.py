"""What a ViT learns before the first block (paper Section 4.5, Fig. 7 left and centre): the principal
components of the patch-embedding filters and the similarity structure of the position embeddings."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.analysis.attention import require_vit


@dataclass(frozen=True)
class EmbeddingFilters:
    components: torch.Tensor  # (k, C, P, P): principal components of E as image patches (unit norm)
    explained_variance_ratio: torch.Tensor  # (k,): share of the filters' variance each component explains


def similarity_from_embeddings(grid_embed: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(G, D) per-patch embeddings in raster order -> (gh, gw, gh, gw) cosine similarities: entry [r, c] is the
    map of patch (r, c)'s similarity to every patch."""
    unit = F.normalize(grid_embed.double(), dim=-1)
    return (unit @ unit.T).float().reshape(*grid, *grid)


def position_embedding_similarity(model: nn.Module, grid: tuple[int, int] | None = None) -> torch.Tensor:
    """(gh, gw, gh, gw) cosine similarity between the position embeddings of every pair of patches, for the
    native grid or `grid` (resampled as the model itself does for other input sizes)."""
    vit = require_vit(model)
    cfg = vit.config
    if cfg.pos_embed in ("none", "relative"):
        raise ValueError(
            f"position-embedding similarity needs absolute position embeddings; this model has pos_embed="
            f"{cfg.pos_embed!r} (no per-patch embedding to compare)"
        )
    grid = tuple(grid or vit.native_grid)
    with torch.no_grad():
        pos = vit.position_embedding(grid).detach()  # (1, P + G, D); native grid returns the parameter itself
    return similarity_from_embeddings(pos[0, cfg.pos_prefix_tokens :], grid)


def principal_filters(weight: torch.Tensor, k: int) -> EmbeddingFilters:
    """PCA of a patch-embedding kernel (D, C, P, P): the D filters are the samples, each a vector of P²·C
    pixel weights. Components are unit vectors, sign fixed so the largest-magnitude entry is positive."""
    d, c, p, q = weight.shape
    filters = weight.detach().reshape(d, -1).double()  # (D, C*P*P)
    centred = filters - filters.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)  # vh: (min(D, CPP), CPP)
    variance = s**2
    k = min(k, vh.shape[0])
    comps = vh[:k]  # (k, CPP)
    # An SVD's signs are arbitrary; make them deterministic so repeated runs draw the same picture.
    peak = comps.gather(1, comps.abs().argmax(dim=1, keepdim=True))  # (k, 1)
    comps = comps * torch.where(peak < 0, -1.0, 1.0)
    ratio = variance[:k] / variance.sum().clamp_min(1e-30)
    return EmbeddingFilters(comps.reshape(k, c, p, q).float(), ratio.float())


def embedding_filters(model: nn.Module, k: int = 28) -> EmbeddingFilters:
    """The first k principal components of the patch-embedding filters E as C×P×P patches (paper Fig. 7
    left), with their explained variance ratio. Not defined for hybrids, whose E acts on ResNet features."""
    vit = require_vit(model)
    if vit.stem is not None:
        raise ValueError(
            "embedding filters are not applicable to hybrid models: their patch embedding acts on ResNet "
            "feature maps, not on pixels"
        )
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    return principal_filters(vit.patch_embed.proj.weight, k)


# A filter bank whose first principal component explains less than this multiple of what it explains in
# Gaussian noise of the same shape has no structure training would give it: it looks like its initialisation.
STRUCTURE_THRESHOLD = 1.5


def _pc1_share(samples: torch.Tensor) -> float:
    """Share of the variance of (D, n) samples that their first principal component explains."""
    centred = samples - samples.mean(dim=0, keepdim=True)
    s = torch.linalg.svdvals(centred)
    return float(s[0] ** 2 / (s**2).sum().clamp_min(1e-30))


def _structure(part, weight: torch.Tensor, draws: int = 3) -> tuple[float, float]:
    """(PC1 share of `part(weight)`, the same for `part` of i.i.d. Gaussian filters of weight's shape, averaged
    over a few seeded draws): what the first component explains beyond chance."""
    d = weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    noise = [_pc1_share(part(torch.randn(weight.shape, generator=gen, dtype=torch.float64)).reshape(d, -1))
             for _ in range(draws)]
    return _pc1_share(part(weight).reshape(d, -1)), sum(noise) / draws


def filter_diagnostics(model: nn.Module) -> dict[str, float | bool]:
    """Numbers that tell trained patch-embedding filters from untouched ones.

    - pc1_share / pc1_share_random: the first component's share of the variance, and the share it would have
      in Gaussian noise of the same shape; trained filters concentrate variance (ViT-B/16: tens of percent
      against about 0.5% for noise), initial ones do not (`looks_untrained`).
    - std_over_init: the weights' std over the initial LeCun-normal std sqrt(1 / fan_in) (official init).
    - RGB models: the same test on the grey part (mean over the channels) and on the colour differences
      (each channel minus that mean). Trained on grey images (R = G = B) the colour differences never
      receive a gradient and keep their initial noise while the grey part learns (`colour_untrained`).
    """
    vit = require_vit(model)
    w = vit.patch_embed.proj.weight.detach().double().cpu()  # (D, C, P, P)
    d, c, p, q = w.shape
    share, noise = _structure(lambda t: t, w)
    out: dict[str, float | bool] = {
        "pc1_share": share, "pc1_share_random": noise, "looks_untrained": share < STRUCTURE_THRESHOLD * noise,
        "std_over_init": float(w.std() / (1.0 / (c * p * q)) ** 0.5),
    }
    if c > 1:
        grey, grey_noise = _structure(lambda t: t.mean(dim=1), w)
        colour, colour_noise = _structure(lambda t: t - t.mean(dim=1, keepdim=True), w)
        out.update(grey_pc1_share=grey, grey_pc1_share_random=grey_noise, colour_pc1_share=colour,
                   colour_pc1_share_random=colour_noise,
                   colour_untrained=bool(colour < STRUCTURE_THRESHOLD * colour_noise
                                         and grey >= STRUCTURE_THRESHOLD * grey_noise))
    return out


def diagnostic_messages(diag: dict[str, float | bool]) -> list[str]:
    """What a reader of the filter figure should know, in words (empty when the filters look trained)."""
    if diag["looks_untrained"]:
        return [f"These filters look untrained (close to random): the first component explains "
                f"{diag['pc1_share']:.1%} of their variance, about what it explains in random filters of this shape "
                f"({diag['pc1_share_random']:.1%}); weight std {diag['std_over_init']:.2f}x the initial one. Brief "
                "training on small images changes the patch embedding little: the components show mostly the "
                "initial noise. Not a bug."]
    if diag.get("colour_untrained"):
        return ["The colour differences of these RGB filters look untrained (like their initial noise) while "
                "their grey-level part learned: typical of training on grey images (R = G = B), where colour "
                "differences never receive a gradient. The components mix in that noise."]
    return []


def row_column_summary(similarity: torch.Tensor) -> dict[str, float | None]:
    """Mean cosine similarity of position-embedding pairs (distinct patches) that share a row, share a column,
    or share neither: a number for the row/column structure the paper's Fig. 7 (centre) shows."""
    gh, gw = similarity.shape[:2]
    sim = similarity.reshape(gh * gw, gh * gw).double()
    rows = torch.arange(gh).repeat_interleave(gw)  # (G,)
    cols = torch.arange(gw).repeat(gh)  # (G,)
    same_row = rows[:, None] == rows[None, :]
    same_col = cols[:, None] == cols[None, :]
    distinct = ~torch.eye(gh * gw, dtype=torch.bool)

    def mean(mask: torch.Tensor) -> float | None:  # None (JSON null) when no pair qualifies, e.g. one row
        return float(sim[mask].mean()) if bool(mask.any()) else None

    return {
        "same_row": mean(same_row & distinct),
        "same_column": mean(same_col & distinct),
        "other": mean(~same_row & ~same_col),
    }
