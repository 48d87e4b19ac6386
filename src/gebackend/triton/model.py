"""Triton's entry point for the `ge` backend (laid out as backends/ge/model.py): a thin adapter, nothing else."""

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
        self.model.close()
