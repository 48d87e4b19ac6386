"""The onnx wheel's model test cases, beside its operator cases: whole models, not one node each.

`onnx/backend/test/data` holds, besides `node`:

- `pytorch-converted` and `pytorch-operator`: PyTorch modules and operators exported by an early exporter (opset 1 to 9,
  IR 3: initializers listed as graph inputs), with their inputs and outputs in `test_data_set_*` as the node cases;
- `simple`: small hand-built models (sequences, string normalisation, Expand, Gradient);
- `light`: nine model-zoo architectures (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet,
  VGG-19, ZFNet-512) whose weights are `ConstantOfShape` of one value, so the file is a few kB; their input is made
  as onnx's own runner makes it (`generate_dummy_data(random=False)`: `arange(n) / n` in the input's shape, a free
  dim taken as 1) and the reference output is `light_<name>_output_0.pb`, with the tolerances of `real/test_<name>`.

Each becomes a `corpus.Case` named `<folder>/<case>`, run exactly as the operator cases are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

MODEL_FOLDERS = ("pytorch-converted", "pytorch-operator", "simple")
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7  # onnx's loader's defaults for model cases


def data_root() -> Path:
    from onnx.backend.test import __file__ as test_init

    return Path(test_init).parent / "data"


def _tolerances(data_json: Path) -> tuple[float, float]:
    if not data_json.is_file():
        return DEFAULT_RTOL, DEFAULT_ATOL
    data = json.loads(data_json.read_text())
    return float(data.get("rtol", DEFAULT_RTOL)), float(data.get("atol", DEFAULT_ATOL))


def dummy_input(value_info: onnx.ValueInfoProto) -> np.ndarray:
    """The input onnx's runner feeds a light model (float tensors only, as there)."""
    dims = value_info.type.tensor_type.shape.dim
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def light_cases(root: Path):
    from onnx import numpy_helper

    from .corpus import Case

    cases = []
    for path in sorted((root / "light").glob("light_*.onnx")):
        model = onnx.load(str(path))
        initializers = {init.name for init in model.graph.initializer}
        inputs = [dummy_input(v) for v in model.graph.input if v.name not in initializers]
        outputs = []
        for index in range(len(model.graph.output)):
            reference = path.with_name(f"{path.stem}_output_{index}.pb")
            if not reference.is_file():
                break
            proto = onnx.TensorProto()
            proto.ParseFromString(reference.read_bytes())
            outputs.append(numpy_helper.to_array(proto))
        if len(outputs) != len(model.graph.output):
            continue  # no reference output shipped
        name = path.stem[len("light_"):]
        rtol, atol = _tolerances(root / "real" / f"test_{name}" / "data.json")
        cases.append(Case(f"light/{name}", model, inputs, outputs, rtol, atol))
    return cases


def load_model_cases():
    """Every model case the wheel ships (none when it ships no data folder), in folder and name order."""
    from .corpus import _load_folder

    root = data_root()
    cases = []
    for folder in MODEL_FOLDERS:
        if (root / folder).is_dir():
            for case in _load_folder(root / folder):
                case.name = f"{folder}/{case.name}"
                cases.append(case)
    if (root / "light").is_dir():
        cases += light_cases(root)
    return cases
