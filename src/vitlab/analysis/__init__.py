"""Looking inside a ViT as the paper does (paper Section 4.5, Appendix D.7–D.8): attention maps and rollout, mean
attention distance, position-embedding similarity, principal components of the embedding filters, and
`analyze`, which writes all of them as figures with an index page and a summary of the numbers."""

from vitlab.analysis.attention import (
    attention_distance_from_attention,
    attention_maps,
    attention_rollout,
    class_token_attention,
    class_token_attention_from_attention,
    grid_distances,
    mean_attention_distance,
    rollout_from_attention,
)
from vitlab.analysis.embeddings import (
    EmbeddingFilters,
    embedding_filters,
    filter_diagnostics,
    position_embedding_similarity,
    principal_filters,
    row_column_summary,
    similarity_from_embeddings,
)
from vitlab.analysis.images import (
    AnalysisInputs,
    dataset_inputs,
    embedded_images,
    image_file_inputs,
    load_images,
    to_display,
)
from vitlab.analysis.report import analyze, analyze_weights

__all__ = [
    "AnalysisInputs", "EmbeddingFilters", "analyze", "analyze_weights", "attention_distance_from_attention",
    "attention_maps", "attention_rollout", "class_token_attention", "class_token_attention_from_attention",
    "dataset_inputs", "embedded_images", "embedding_filters", "filter_diagnostics", "grid_distances",
    "image_file_inputs", "load_images", "mean_attention_distance", "position_embedding_similarity",
    "principal_filters", "rollout_from_attention", "row_column_summary", "similarity_from_embeddings", "to_display",
]
