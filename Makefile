# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
DEMO_DIR ?= demo
DEMO_SIZE ?= 1g
DEMO_PORT ?= 8000

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
	$(PY) -m hotweights --log-level warning verify --engine hotweights --device cpu --model $(DEMO_DIR)/model \
		--out $(DEMO_DIR)/verify --port $(DEMO_PORT)

bench-cpu: $(VENV)/.installed
	$(PY) benchmarks/attach_cpu.py --size 1g --json

clean:
	rm -rf $(VENV) $(DEMO_DIR)
