"""Triton's entry point for the `ge` backend (laid out as backends/ge/model.py): a thin adapter, nothing else.

`finalize()` leaves nothing of pb_utils alive: tritonserver 2.51's stub destroys this object only after it has torn
itself down, and a pb_utils metric destroyed then crashes the stub (triton/metrics.py)."""

import gc

import triton_python_backend_utils as pb_utils

from gebackend.triton.bridge import ServedModel, auto_complete


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return auto_complete(auto_complete_model_config, pb_utils)

    def initialize(self, args):
        self.model = ServedModel.load(args, pb_utils)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        model, self.model = self.model, None
        model.close()
        del model
        gc.collect()  # what a reference cycle still held goes now, while the stub can release it
