"""examples/cnclip_client.py run as a user runs it, against the CN_CLIP ensembles served with stand-in encoders.

The images are made here (solid red, green and blue pictures, a gradient, in JPEG, PNG and WebP). The stand-ins'
random weights make the labels meaningless, so what is checked is that the printed output is well-formed and
that every printed number equals a reference computed here from the client-side pipeline (cn_clip's
preprocessing and tokenizer, onnxruntime on the same ONNX files, L2 norm; test_cnclip_service's references):
cosine similarities, the softmax of 100 x cosine, and the ranking. One server for the module (the
test_cnclip_service fixture).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from gebackend.server.ports import free_ports

from .conftest import ROOT
from .test_cnclip_service import cnclip, expected_image, expected_text, l2  # noqa: F401 (cnclip: the server fixture)

pytestmark = pytest.mark.e2e

CLIENT = ROOT / "examples" / "cnclip_client.py"
LABELS = ["红色", "绿色", "蓝色", "一只猫", "Crème brûlée"]
LINE = re.compile(r"^  (\d+)  (\d\.\d{4})  cos=([+-]\d\.\d{4})  (.+)$")
PRINTED = 5e-5 + 1e-6  # 4 decimals, rounded, and float32 noise


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    for name, colour, size in (("red.png", (255, 0, 0), (64, 48)), ("green.jpg", (0, 200, 0), (300, 200)),
                               ("blue.webp", (0, 0, 255), (224, 224))):
        Image.new("RGB", size, colour).save(folder / name)
    gradient = np.linspace(0, 255, 320 * 240 * 3).reshape(240, 320, 3).astype(np.uint8)
    Image.fromarray(gradient).save(folder / "gradient.JPEG")
    (folder / "notes.txt").write_text("not an image: left out by its extension")
    return folder


def run_client(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CLIENT), *args], capture_output=True, text=True, timeout=timeout)


def url(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def parse(stdout: str) -> dict[str, list[tuple[int, float, float, str]]]:
    """`name` lines, each followed by its ranked `  rank  prob  cos=...  label` lines."""
    blocks: dict[str, list] = {}
    current = None
    for line in stdout.splitlines():
        match = LINE.match(line)
        if match:
            assert current is not None, stdout
            rank, prob, cos, label = match.groups()
            blocks[current].append((int(rank), float(prob), float(cos), label))
        else:
            assert line and not line.startswith(" "), f"malformed line {line!r} in\n{stdout}"
            current = line
            blocks[current] = []
    return blocks


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def image_embeddings(sessions, folder) -> tuple[list[str], np.ndarray]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"))
    return [f.name for f in files], l2(expected_image(sessions, [f.read_bytes() for f in files]))


def label_embeddings(sessions, tokenizer, labels, templates) -> np.ndarray:
    """cn_clip's zero_shot_classifier on the reference embeddings: mean of normalised prompts, normalised."""
    prompts = [t.format(label).lower() for label in labels for t in templates]
    per_prompt = l2(expected_text(sessions, tokenizer, prompts)).reshape(len(labels), len(templates), -1)
    return l2(per_prompt.mean(axis=1))


def assert_ranked(printed: list[tuple[int, float, float, str]], names: list[str], prob: np.ndarray, cos: np.ndarray,
                  top_k: int, by: np.ndarray):
    """The printed lines are the top-k by `by`, ranks 1..k, each with the reference's probability and cosine."""
    assert [r for r, *_ in printed] == list(range(1, min(top_k, len(names)) + 1))
    for _, p, c, name in printed:
        i = names.index(name)
        assert abs(p - prob[i]) <= PRINTED and abs(c - cos[i]) <= PRINTED, (name, p, prob[i], c, cos[i])
    chosen = [names.index(name) for *_, name in printed]
    assert all(by[a] >= by[b] - 1e-6 for a, b in zip(chosen, chosen[1:])), printed
    rest = [i for i in range(len(names)) if i not in chosen]
    assert all(by[chosen[-1]] >= by[i] - 1e-6 for i in rest), (printed, by)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_prints_the_top_k_labels_with_cn_clips_zero_shot_numbers(cnclip, images, protocol):
    server, sessions, tokenizer = cnclip
    done = run_client("classify", str(images), "--labels", ",".join(LABELS), "--top-k", "3",
                      "--protocol", protocol, "--url", url(server, protocol))
    assert done.returncode == 0, done.stderr
    names, image_features = image_embeddings(sessions, images)
    cos = image_features @ label_embeddings(sessions, tokenizer, LABELS, ["{}的图片"]).T
    prob = softmax(100 * cos)
    blocks = parse(done.stdout)
    assert list(blocks) == names  # every image, in file-name order, the text file left out
    for row, name in enumerate(names):
        assert_ranked(blocks[name], LABELS, prob[row], cos[row], 3, by=prob[row])


def test_classify_with_several_templates_small_batches_and_json(cnclip, images):
    """Two prompts per label (cn_clip's prompt ensembling), 2 items a request: the same numbers as one batch."""
    server, sessions, tokenizer = cnclip
    templates = ["{}的图片", "一张{}的照片"]
    args = ["classify", str(images), "--labels", ",".join(LABELS), "--top-k", "5", "--protocol", "grpc",
            "--url", server.grpc_url, "--template", templates[0], "--template", templates[1], "--batch-size", "2"]
    done = run_client(*args, "--json")
    assert done.returncode == 0, done.stderr
    names, image_features = image_embeddings(sessions, images)
    cos = image_features @ label_embeddings(sessions, tokenizer, LABELS, templates).T
    prob = softmax(100 * cos)
    results = json.loads(done.stdout)["results"]
    assert [r["image"] for r in results] == names
    for row, result in enumerate(results):
        got = {t["label"]: (t["prob"], t["cosine"]) for t in result["top"]}
        assert sorted(got) == sorted(LABELS)
        probs = [t["prob"] for t in result["top"]]
        assert probs == sorted(probs, reverse=True)
        for i, label in enumerate(LABELS):
            np.testing.assert_allclose(got[label], (prob[row, i], cos[row, i]), rtol=1e-4, atol=1e-5)
    text = run_client(*args)
    assert text.returncode == 0 and list(parse(text.stdout)) == names


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_search_prints_the_top_k_images_for_a_query(cnclip, images, protocol):
    server, sessions, tokenizer = cnclip
    query = "一张“红色”的图片"
    done = run_client("search", str(images), query, "--top-k", "2", "--protocol", protocol, "--url", url(server, protocol))
    assert done.returncode == 0, done.stderr
    names, image_features = image_embeddings(sessions, images)
    text_features = l2(expected_text(sessions, tokenizer, ['一张"红色"的图片']))[0]  # cn_clip's _preprocess_text
    cos = image_features @ text_features
    blocks = parse(done.stdout)
    assert list(blocks) == [f"query: {query}"]
    assert_ranked(blocks[f"query: {query}"], names, softmax(100 * cos), cos, 2, by=cos)


def test_an_undecodable_file_is_skipped_and_named(cnclip, images, tmp_path):
    server, sessions, tokenizer = cnclip
    for f in images.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8 this is no JPEG")
    done = run_client("classify", str(tmp_path), "--labels", "红色,蓝色", "--url", server.http_url)
    assert done.returncode == 0, done.stderr
    assert f"skipped {tmp_path / 'broken.jpg'}:" in done.stderr and "expected an encoded JPEG, PNG or WebP" in done.stderr
    assert "Traceback" not in done.stderr
    names, _ = image_embeddings(sessions, images)
    assert list(parse(done.stdout)) == names


def test_clear_errors_without_a_server_or_a_model(cnclip, images, tmp_path):
    server, _, _ = cnclip
    port, = free_ports(1)
    for protocol in ("http", "grpc"):
        done = run_client("classify", str(images), "--labels", "猫", "--protocol", protocol, "--url", f"127.0.0.1:{port}")
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert f"no Triton server answers {protocol} at 127.0.0.1:{port}" in done.stderr, done.stderr
        assert "make serve-cnclip" in done.stderr and "Traceback" not in done.stderr
    done = run_client("search", str(images), "猫", "--url", server.http_url, "--text-model", "cnclip_nope")
    assert done.returncode == 2 and "model 'cnclip_nope' is not ready on the server" in done.stderr, done.stderr
    done = run_client("classify", str(tmp_path), "--labels", "猫", "--url", server.http_url)
    assert done.returncode == 2 and f"no images (.jpg, .jpeg, .png, .webp) in {tmp_path}" in done.stderr, done.stderr
    done = run_client("classify", str(images), "--url", server.http_url)
    assert done.returncode == 2 and "no labels" in done.stderr, done.stderr
