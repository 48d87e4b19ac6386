"""Conformance: the ONNX operator test corpus through the plain engines and through gebackend in both graph modes."""
