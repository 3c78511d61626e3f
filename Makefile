# Two commands do all the set-up: `make demo` and `make test`.
# Each creates .venv when missing and installs torch (override TORCH_SPEC for a
# CUDA build, e.g. TORCH_SPEC="torch==2.13.0 --index-url ...") and the package.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR ?= demo
DEMO_GPU ?= L4

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch goes first and pinned, so that no other package pulls an unpinned build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[hf,dev]"
	# lhotse declares an unpinned torch: install it without deps so torch stays as chosen.
	$(BIN)/python -m pip install -q --no-deps "lhotse==1.33.0" audioread cytoolz toolz intervaltree tabulate urllib3
	touch $@

demo: $(VENV)/.installed
	$(BIN)/asrfit demo-data $(DEMO_DIR) --overwrite
	$(BIN)/asrfit profile --model wav2vec2-base --data $(DEMO_DIR)/train.jsonl --gpu $(DEMO_GPU)
	$(BIN)/asrfit memory --model wav2vec2-base --batch 8 --seconds 16 --precision bf16 --gpu $(DEMO_GPU)

test: $(VENV)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/python -m pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

# Benchmarks write their sections of docs/benchmarks.md (the command sits beside each figure).
bench: $(VENV)/.installed
	$(BIN)/python bench/memory_accuracy.py --out docs/benchmarks.md
	$(BIN)/python bench/sampler_efficiency.py --out docs/benchmarks.md
	$(BIN)/python bench/plan_speed.py --out docs/benchmarks.md
	$(BIN)/python bench/profile_speed.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) build dist src/*.egg-info
