"""Models for use outside PyTorch: ONNX export with a dynamic batch, checked against ONNX Runtime before it is
written (`vitlab export`, `vitlab.export_onnx`). Needs the optional `onnx` extra: pip install 'vitlab[onnx]'."""

from vitlab.deploy.onnx_export import EXPORT_PRECISIONS, ExportReport, export_onnx, export_weights

__all__ = ["EXPORT_PRECISIONS", "ExportReport", "export_onnx", "export_weights"]
