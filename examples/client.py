"""Talk to a running `gebackend serve` over HTTP and gRPC with tritonclient, and check every answer.

    .venv/bin/python examples/client.py [--http localhost:8000] [--grpc localhost:8001] [--repo examples/model_repository]

For every ready model of the repository it sends a random request over both protocols and compares the outputs with
onnxruntime run directly on the same ONNX file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, triton_to_np_dtype

HERE = Path(__file__).resolve().parent


def random_inputs(metadata: dict, rng: np.random.Generator, batch: int = 2, free_dim: int = 8) -> dict[str, np.ndarray]:
    feeds = {}
    for tensor in metadata["inputs"]:
        shape = [int(d) for d in tensor["shape"]]
        shape = [batch if i == 0 and d == -1 else (free_dim if d == -1 else d) for i, d in enumerate(shape)]
        dtype = triton_to_np_dtype(tensor["datatype"])
        if np.issubdtype(dtype, np.floating):
            feeds[tensor["name"]] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[tensor["name"]] = rng.integers(0, 2, size=shape).astype(dtype)  # token ids and masks alike
    return feeds


def as_the_model_sees_them(config: dict, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Apply config.pbtxt's `reshape` (what Triton does between client and model) for the onnxruntime reference."""
    batching = int(config.get("max_batch_size") or 0) > 0
    out = dict(feeds)
    for entry in config.get("input", []):
        if "reshape" in entry and entry["name"] in out:
            array = out[entry["name"]]
            shape = [int(d) for d in entry["reshape"].get("shape", [])]
            out[entry["name"]] = array.reshape([array.shape[0], *shape] if batching else shape)
    return out


def infer(module, client, model: str, feeds: dict[str, np.ndarray]):
    inputs = []
    for name, array in feeds.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", default="localhost:8000")
    parser.add_argument("--grpc", default="localhost:8001")
    parser.add_argument("--repo", type=Path, default=HERE / "model_repository")
    args = parser.parse_args()

    http = httpclient.InferenceServerClient(args.http)
    grpc = grpcclient.InferenceServerClient(args.grpc)
    for protocol, url, client in (("http", args.http, http), ("grpc", args.grpc, grpc)):
        try:
            client.is_server_live()
        except Exception as exc:  # noqa: BLE001 - refused connection, DNS, timeout: all mean "no server here"
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            print(f"no Triton server answers {protocol} at {url} ({reason}); start one with `make serve`, "
                  f"or pass --{protocol} HOST:PORT", file=sys.stderr)
            return 2
    rng = np.random.default_rng(0)
    failures = 0
    models = sorted(p.parent.name for p in args.repo.glob("*/config.pbtxt"))
    for model in models:
        if not http.is_model_ready(model):
            print(f"{model}: not ready")
            continue
        metadata = http.get_model_metadata(model)
        feeds = random_inputs(metadata, rng)
        onnx_file = next(iter(sorted((args.repo / model).glob("*/*.onnx"))), None)
        expected = None
        if onnx_file is not None:
            session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
            model_feeds = as_the_model_sees_them(http.get_model_config(model), feeds)
            expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, model_feeds)))
        for protocol, module, client in (("http", httpclient, http), ("grpc", grpcclient, grpc)):
            try:
                result = infer(module, client, model, feeds)
            except InferenceServerException as exc:  # the server's answer says what failed
                print(f"{model} [{protocol}]: FAILED: {exc}")
                failures += 1
                continue
            shapes = {o["name"]: result.as_numpy(o["name"]).shape for o in metadata["outputs"]}
            verdict = "served"
            if expected is not None:
                got = {n: result.as_numpy(n).reshape(v.shape) for n, v in expected.items()}  # an output's reshape
                worst = max(float(np.max(np.abs(got[n] - v))) for n, v in expected.items())
                ok = all(np.allclose(got[n], v, rtol=1e-5, atol=1e-6) for n, v in expected.items())
                verdict = f"matches onnxruntime (max abs diff {worst:.2e})" if ok else f"DIFFERS from onnxruntime ({worst:.2e})"
                failures += not ok
            print(f"{model} [{protocol}]: {shapes} {verdict}")
    http.close()
    grpc.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
