"""Real pretrained ONNX files that PyPI packages ship inside their wheels, with real inputs and task-level checks."""
