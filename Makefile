# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
DEMO_DIR ?= demo
DEMO_SIZE ?= 1g

.PHONY: demo test bench-cpu clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q

demo: $(VENV)/.installed
	@test -f $(DEMO_DIR)/model/config.json || $(PY) -m hotweights demo-model $(DEMO_DIR)/model --size $(DEMO_SIZE)
	$(PY) -m hotweights --log-level warning preload --model $(DEMO_DIR)/model
	@echo "--- disk load (load format auto) ---"
	$(PY) -m hotweights --log-level warning generate --model $(DEMO_DIR)/model --load-format auto --max-tokens 8
	@echo "--- warm start from the weight cache, fallback disabled ---"
	$(PY) -m hotweights generate --model $(DEMO_DIR)/model --max-tokens 8 \
		--model-loader-extra-config '{"fallback": false}' 2>&1 | grep -E "Mapped|weight cache|falling back|^\["
	$(PY) -m hotweights status

bench-cpu: $(VENV)/.installed
	$(PY) benchmarks/attach_cpu.py --size 1g --json

clean:
	rm -rf $(VENV) $(DEMO_DIR)
