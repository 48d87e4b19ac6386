# Two commands a newcomer needs: `make serve` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
REPO := examples/model_repository

.PHONY: setup models serve test clean tools

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,bench]'
	touch $(STAMP)

setup: $(STAMP) models

models: $(STAMP)
	$(PY) -m gebackend.modelzoo $(REPO)

serve: setup
	$(VENV)/bin/gebackend serve $(REPO)

test: setup
	$(PY) -m pytest

# perf_analyzer (from the tritonclient 2.41.0 wheel, unpacked only) into tools/ for `gebackend bench`
tools: $(STAMP)
	bash tools/install_perf_analyzer.sh $(PY)

clean:
	rm -rf $(VENV) $(REPO)/*/[0-9]*/
