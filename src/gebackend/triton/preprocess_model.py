"""Triton's entry point for the preprocessing backends (laid out as backends/<backend>/model.py for each of
`gebackend.preprocess.models.KINDS`, e.g. cnclip_image_preprocess): a thin adapter; the config's `backend` says
which preprocessing it runs. `finalize()` leaves nothing of pb_utils alive, as triton/model.py's does."""

import gc
import json

import triton_python_backend_utils as pb_utils

from gebackend.preprocess.serving import PreprocessModel, auto_complete, kind_for


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return auto_complete(kind_for(auto_complete_model_config.as_dict()), auto_complete_model_config, pb_utils)

    def initialize(self, args):
        self.model = PreprocessModel.load(kind_for(json.loads(args["model_config"])), args, pb_utils)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        model, self.model = self.model, None
        model.close()
        del model
        gc.collect()  # what a reference cycle still held goes now, while the stub can release it
