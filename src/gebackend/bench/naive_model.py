"""The naive baseline: what a user writes to serve an ONNX file on Triton's Python backend in ~30 lines.

`gebackend bench` copies this file as `<model>/1/model.py` of a `backend: "python"` model, beside
`1/model.onnx`. A default `onnxruntime.InferenceSession`, one `run` per request, no batching, no tuning.
It imports nothing from gebackend, so it is exactly what runs without this project.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            results = self.session.run(self.outputs, feeds)
            tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in zip(self.outputs, results)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        self.session = None
