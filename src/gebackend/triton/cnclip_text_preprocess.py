"""Triton's entry point for the `cnclip_text_preprocess` backend (laid out as backends/cnclip_text_preprocess/model.py): a thin adapter."""

import triton_python_backend_utils as pb_utils

from gebackend.preprocess.models import TEXT
from gebackend.preprocess.serving import PreprocessModel, auto_complete


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return auto_complete(TEXT, auto_complete_model_config, pb_utils)

    def initialize(self, args):
        self.model = PreprocessModel.load(TEXT, args, pb_utils)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.close()
