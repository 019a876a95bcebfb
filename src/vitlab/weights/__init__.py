"""Reading and writing weights. Import the submodules directly (`vitlab.weights.load`, `.jax_npz`, …)."""

from ..errors import WeightsError

__all__ = ["WeightsError"]
