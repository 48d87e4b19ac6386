"""Graph passes that turn an ONNX model into a static graph, and the doctor that reports on them; one pass per file.

`passes` runs them in order for one shape set, skipping (with a warning) a pass that fails on a model:
`specialize` fixes the graph inputs' dims and infers the rest, `upgrade` brings old files (IR < 4, opset < 7)
to what the folder needs, `fold` folds constants and removes dead nodes, `unused_rows` computes only the rows of a
sequence an output keeps (with `row_rules`, its rules per op). `runtime_shapes` says which tensors' shapes only a run
can tell, `constants` finds constant subgraphs, and `doctor` reports what stops
a model from being static and what folding would remove; `pipeline` compiles every bucket of a model.
"""
