"""The CN_CLIP ensembles (examples/cnclip_repository with stand-in encoders) through the real CLI and tritonserver.

Image bytes and text go in; the embeddings that come out must equal the client-side pipeline: cn_clip's
preprocessing (the reference in tests/unit/test_cnclip_preprocess.py, written from cn_clip's transform steps) and
cn_clip's own tokenizer, then onnxruntime on the same ONNX files and cn_clip's L2 normalisation. Bad payloads get
400 / INVALID_ARGUMENT naming the input, and the server goes on serving. One server for the module.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from gebackend.modelzoo.cnclip_repository import build_cnclip_repository

from .conftest import ROOT
from .server import start_server

pytestmark = pytest.mark.e2e

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
MODELS = ("cnclip_image", "cnclip_text", "cnclip_image_preprocess", "cnclip_text_preprocess", "cnclip_image_encoder",
          "cnclip_text_encoder")
TEXTS = ["一只可爱的小猫在草地上玩耍。", "a photo of a cat", "", "   ", "我爱北京天安门🐱🥰👍🏽", "Crème brûlée café, naïve! ＡＢＣ１２３",
         "长" * 80, " ".join(["preprocessing"] * 40), "COVID-19 疫情期间的 e-mail：2024年3月", "\x00\u200b控制\x7f字符"]


def _reference_module():
    """The cn_clip references of the unit tests (tests/unit is not a package, so load the file)."""
    path = ROOT / "tests" / "unit" / "test_cnclip_preprocess.py"
    spec = importlib.util.spec_from_file_location("cnclip_unit_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _reference_module()


@pytest.fixture(scope="module")
def cnclip(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cnclip") / "models"
    shutil.copytree(ROOT / "examples" / "cnclip_repository", repo, ignore=shutil.ignore_patterns("[0-9]*"))
    build_cnclip_repository(repo, "standin", cache=ref.CACHE, log=lambda m: None)
    tokenizer_module, vocab = ref.load_cn_clip_reference(tmp_path_factory.mktemp("cn_clip"))
    sessions = {name: ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
                for name in ("cnclip_image_encoder", "cnclip_text_encoder")}
    server = start_server(repo, tmp_path_factory.mktemp("cnclip_logs") / "serve.log")
    yield server, sessions, tokenizer_module.FullTokenizer(str(vocab))
    assert server.stop() == 0


def client(server, protocol):
    module = PROTOCOLS[protocol]
    return module, module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)


def infer_strings(server, protocol, model, name, values: list[bytes]):
    module, c = client(server, protocol)
    tensor = module.InferInput(name, [len(values), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[v] for v in values], dtype=object))
    return c.infer(model, [tensor])


def l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)  # cn_clip's CLIP.forward: x / x.norm(dim=-1, keepdim=True)


def expected_image(sessions, images: list[bytes]) -> np.ndarray:
    pixels = np.stack([ref.cn_clip_image_bytes(data) for data in images])
    return sessions["cnclip_image_encoder"].run(None, {"image": pixels})[0]


def expected_text(sessions, tokenizer, texts: list[str]) -> np.ndarray:
    return sessions["cnclip_text_encoder"].run(None, {"text": ref.cn_clip_tokenize(tokenizer, texts)})[0]


def assert_embeddings(result, kind: str, unnorm: np.ndarray):
    got_unnorm, got = result.as_numpy(f"unnorm_{kind}_features"), result.as_numpy(f"{kind}_features")
    assert got.shape == unnorm.shape and got_unnorm.shape == unnorm.shape and got.dtype == np.float32
    np.testing.assert_allclose(got_unnorm, unnorm, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, l2(unnorm), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)


@functools.lru_cache(maxsize=1)
def _image_files() -> tuple[bytes, ...]:
    images = ref.make_images(np.random.default_rng(11))
    names = ["rgb_640x480.jpg", "rgb_97x300.png", "rgb_640x480.webp", "grey_300x200.png", "rgba_320x240.png",
             "palette_256x128.png", "cmyk_240x180.jpg", "rgb_224x224.jpg"]
    return tuple(images[n] for n in names)


def image_files() -> list[bytes]:
    return list(_image_files())


def test_every_model_is_ready_and_auto_completed(cnclip):
    server, _, _ = cnclip
    out = server.output()
    for model in MODELS:
        assert re.search(rf"^  {model} v1: READY$", out, re.M), out[-3000:]
    assert re.search(r"model 'cnclip_text_preprocess' instance .* loaded .* cn_clip tokenize\(context_length=52\)", out)
    # the encoder runs each batch only as long as its longest text (the tokenizer pads to 52): what the config asks
    assert ("model 'cnclip_text_encoder': trim_padding: 'text' cut after its last token other than 0; checked at load: "
            "the outputs do not move when the padding is cut") in out
    _, c = client(server, "http")
    config = c.get_model_config("cnclip_text_preprocess")
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("text", "TYPE_STRING", [1])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("token_ids", "TYPE_INT64", [52])]
    image_config = c.get_model_config("cnclip_image_preprocess")
    assert [(o["name"], o["dims"]) for o in image_config["output"]] == [("pixel_values", [3, 224, 224])]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_image_ensemble_equals_cn_clip_preprocessing_and_onnxruntime(cnclip, protocol):
    server, sessions, _ = cnclip
    images = image_files()
    assert_embeddings(infer_strings(server, protocol, "cnclip_image", "image", images), "image", expected_image(sessions, images))
    one = images[:1]
    assert_embeddings(infer_strings(server, protocol, "cnclip_image", "image", one), "image", expected_image(sessions, one))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_text_ensemble_equals_cn_clip_tokenizer_and_onnxruntime(cnclip, protocol):
    server, sessions, tokenizer = cnclip
    for batch in (TEXTS[:8], TEXTS[8:], TEXTS[2:3]):
        result = infer_strings(server, protocol, "cnclip_text", "text", [t.encode("utf-8") for t in batch])
        assert_embeddings(result, "text", expected_text(sessions, tokenizer, batch))


def test_preprocessing_models_answer_directly(cnclip):
    server, _, tokenizer = cnclip
    for batch in (TEXTS[:8], TEXTS[8:]):  # max_batch_size 8
        result = infer_strings(server, "grpc", "cnclip_text_preprocess", "text", [t.encode() for t in batch])
        np.testing.assert_array_equal(result.as_numpy("token_ids"), ref.cn_clip_tokenize(tokenizer, batch))
    images = image_files()[:3]
    result = infer_strings(server, "http", "cnclip_image_preprocess", "image", images)
    np.testing.assert_array_equal(result.as_numpy("pixel_values"), np.stack([ref.cn_clip_image_bytes(d) for d in images]))


def test_concurrent_requests_each_get_their_own_embeddings(cnclip):
    server, sessions, tokenizer = cnclip
    images = image_files()
    jobs = [("image", [images[i % len(images)], images[(i + 3) % len(images)]][: 1 + i % 2]) for i in range(12)]
    jobs += [("text", TEXTS[i % len(TEXTS): i % len(TEXTS) + 1 + i % 3]) for i in range(12)]

    def send(job_index):
        kind, items = jobs[job_index]
        protocol = "grpc" if job_index % 2 else "http"
        payload = items if kind == "image" else [t.encode() for t in items]
        return infer_strings(server, protocol, f"cnclip_{kind}", kind, payload)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(send, range(len(jobs))))
    for (kind, items), result in zip(jobs, results):
        want = expected_image(sessions, items) if kind == "image" else expected_text(sessions, tokenizer, items)
        assert_embeddings(result, kind, want)


def truncated_jpeg() -> bytes:
    data = ref.encode(Image.fromarray(np.random.default_rng(2).integers(0, 255, (200, 300, 3), dtype=np.uint8)), "JPEG")
    return data[: len(data) // 3]


BAD = [
    ("cnclip_image", "image", np.random.default_rng(5).bytes(500), "expected an encoded JPEG, PNG or WebP image"),
    ("cnclip_image", "image", truncated_jpeg(), "could not decode"),
    ("cnclip_text", "text", b"\xe4\xb8\xad\xff\xfe", "expected UTF-8 text"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model,name,payload,fragment", BAD, ids=["random_bytes", "truncated_jpeg", "invalid_utf8"])
def test_bad_payloads_get_invalid_argument_and_the_server_keeps_serving(cnclip, protocol, model, name, payload, fragment):
    server, sessions, tokenizer = cnclip
    good = image_files()[0] if name == "image" else "好的".encode()
    with pytest.raises(InferenceServerException) as info:
        infer_strings(server, protocol, model, name, [good, payload])  # item 1 of the request is bad
    status, message = str(info.value.status()), str(info.value)
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), (status, message)
    assert f"input '{name}' item 1 of 2" in message and fragment in message and f"{model}_preprocess" in message, message
    assert "Traceback" not in message
    result = infer_strings(server, protocol, model, name, [good])  # the next good request succeeds
    want = expected_image(sessions, [good]) if name == "image" else expected_text(sessions, tokenizer, ["好的"])
    assert_embeddings(result, name, want)


def test_a_bad_request_among_concurrent_good_ones_fails_alone(cnclip):
    server, sessions, _ = cnclip
    images = image_files()

    def send(i):
        payload = [b"definitely not an image"] if i == 4 else [images[i % len(images)]]
        try:
            return infer_strings(server, "grpc", "cnclip_image", "image", payload)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(send, range(10)))
    for i, result in enumerate(results):
        if i == 4:
            assert isinstance(result, InferenceServerException) and "INVALID_ARGUMENT" in str(result.status())
        else:
            assert_embeddings(result, "image", expected_image(sessions, [images[i % len(images)]]))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("kind", ["image", "text"])
def test_each_ensemble_output_can_be_asked_for_alone(cnclip, protocol, kind):
    server, sessions, tokenizer = cnclip
    module, c = client(server, protocol)
    if kind == "image":
        values, model, name, unnorm = image_files()[:2], "cnclip_image", "image", expected_image(sessions, image_files()[:2])
    else:
        texts = TEXTS[:3]
        values, model, name, unnorm = [t.encode() for t in texts], "cnclip_text", "text", expected_text(sessions, tokenizer, texts)
    for wanted, expected in ((f"{kind}_features", l2(unnorm)), (f"unnorm_{kind}_features", unnorm)):
        tensor = module.InferInput(name, [len(values), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[v] for v in values], dtype=object))
        result = c.infer(model, [tensor], outputs=[module.InferRequestedOutput(wanted)])
        np.testing.assert_allclose(result.as_numpy(wanted), expected, rtol=1e-4, atol=1e-5)
        other = f"unnorm_{kind}_features" if wanted == f"{kind}_features" else f"{kind}_features"
        assert result.as_numpy(other) is None  # only what was asked for comes back
