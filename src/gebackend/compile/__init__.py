"""Graph passes that turn an ONNX model into a static graph: specialise, fold, doctor; one pass per file.

`specialize` fixes the graph inputs' dims, `fold` folds constants and removes dead nodes, and `doctor`
reports what stops a model from being static and what folding would remove.
"""
