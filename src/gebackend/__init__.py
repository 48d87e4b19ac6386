"""gebackend: serve ONNX models fast on Triton Inference Server through the Python-based `ge` backend."""

__version__ = "0.1.0"
