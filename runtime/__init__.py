"""kztts: Qwen3-TTS (12 Hz) on ONNX Runtime, CPU and Qualcomm QNN/HTP."""
from kztts.errors import BundleError, ContextOverflowError, KzttsError

__all__ = ["BundleError", "ContextOverflowError", "KzttsError"]
__version__ = "0.1.0"
