# Two commands a newcomer needs: `make serve` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
REPO := examples/model_repository
CNCLIP_REPO := examples/cnclip_repository

.PHONY: setup models serve test clean tools peer cnclip serve-cnclip image deploy-tools

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,bench]'
	touch $(STAMP)

setup: $(STAMP) models

models: $(STAMP)
	$(PY) -m gebackend.modelzoo $(REPO)

serve: setup
	$(VENV)/bin/gebackend serve $(REPO)

# CN_CLIP as two ensembles (bytes/text -> preprocessing -> encoder -> L2 norm): writes the encoders, the normalisation
# model and cn_clip's vocab into $(CNCLIP_REPO). The real CN_CLIP encoders when torch is installed (the `cnclip`
# extra, or the test extra `setup` installs), else small stand-ins with CN_CLIP's interface (the log says which). CNCLIP_ENCODERS=standin|cnclip|cnclip_l4
# chooses; CNCLIP_IMAGE_ONNX / CNCLIP_TEXT_ONNX take files exported by cn_clip's deploy/pytorch_to_onnx.py.
CNCLIP_ARGS = --encoders $(or $(CNCLIP_ENCODERS),auto) $(if $(CNCLIP_IMAGE_ONNX),--image-onnx $(CNCLIP_IMAGE_ONNX)) \
    $(if $(CNCLIP_TEXT_ONNX),--text-onnx $(CNCLIP_TEXT_ONNX)) $(if $(FORCE),--force)

cnclip: $(STAMP)
	$(PY) -m gebackend.modelzoo.cnclip_repository $(CNCLIP_REPO) $(strip $(CNCLIP_ARGS))

serve-cnclip: cnclip
	$(VENV)/bin/gebackend serve $(CNCLIP_REPO)

test: setup
	$(PY) -m pytest

# perf_analyzer (from the tritonclient 2.41.0 wheel, unpacked only) into tools/ for `gebackend bench`
tools: $(STAMP)
	bash tools/install_perf_analyzer.sh $(PY)

# The peer the bench compares with: Triton's C++ onnxruntime backend (r24.10, CPU only) built against the pinned
# onnxruntime wheel's library into peer-backend/ (git-ignored, never shipped); needs cmake, g++, rapidjson-dev and
# googletest. PEER_ARGS='--src DIR --ort-include DIR' builds from local checkouts. docs/benchmarks.md#the-peer
peer: $(STAMP)
	bash tools/build_peer_backend.sh --python $(PY) $(PEER_ARGS)

clean:
	rm -rf $(VENV) $(REPO)/*/[0-9]*/ $(CNCLIP_REPO)/*/[0-9]*/

# The serving image (Containerfile) FROM a Debian rootfs made here with debootstrap: no registry is needed.
# docs/deploy.md. IMAGE=localhost/gebackend:latest by default.
image:
	bash tools/build_image.sh

# What `make image` and the container/deploy tests need (root): podman, buildah, runc, debootstrap and kubectl; HAProxy
# for bench/scale_out.py's round-robin proxy.
# kubectl: the `kubectl` package where an apt source has it, else Debian's kubernetes-client (whose kustomize is too
# old for deploy/k8s: the test then skips, saying so).
deploy-tools:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends podman buildah runc debootstrap \
	    uidmap slirp4netns fuse-overlayfs ca-certificates haproxy
	command -v kubectl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y kubectl \
	    || DEBIAN_FRONTEND=noninteractive apt-get install -y kubernetes-client
