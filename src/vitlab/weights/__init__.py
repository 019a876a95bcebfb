"""Reading and writing weights. Import the submodules directly (`vitlab.weights.load`, `.jax_npz`, …)."""

from vitlab.errors import WeightsError

__all__ = ["WeightsError"]
