# Two commands do all the set-up: `make demo` and `make test`.
# Each creates .venv when missing and installs torch (override TORCH_SPEC for a
# CUDA build, e.g. TORCH_SPEC="torch==2.13.0 --index-url ...") and the package.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR ?= demo
DEMO_GPU ?= L4
DEMO_MODEL ?= conformer-ctc-tiny
DEMO_RUN ?= runs/demo
# conformer-ctc-tiny: 1.1 M parameters (d_model 96, 4 layers), no dropout; without SpecAugment
# too, as the synthetic corpus is clean. It learns the corpus in minutes on 2 CPU cores.
DEMO_TRAIN_ARGS ?= --no-spec-augment

SPEECH_DIR ?= demo-speech
SPEECH_RUN ?= runs/demo-speech
SPEECH_MODEL ?= conformer-ctc-small
# The speech recipe: conformer-ctc-small (d_model 128, 6 layers, dropout 0.1) at batch 8, lr 2e-3,
# a 64-channel subsampling front-end, 40 mel bins, intermediate CTC on block 3, no SpecAugment:
# the last three chosen on this corpus's dev split alone (docs/history.md). On this corpus the
# plan predicts 80 s an epoch on a 2-core host: 11 epochs (14.7 min) fit the 15-minute budget.
SPEECH_TRAIN_ARGS ?= --target-batch 8 --epochs 11 --lr 2e-3 --no-spec-augment --set subsampling_conv_channels=64 \
	--set num_mel_bins=40 --set intermediate_ctc_layer=3

.PHONY: demo demo-speech test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch goes first and pinned, so that no other package pulls an unpinned build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[hf,tensorboard,dev,speech,lightning]"
	# pyctcdecode 0.5.0 pins numpy<2 (stale; it runs on numpy 2): install it without deps.
	$(BIN)/python -m pip install -q --no-deps "pyctcdecode==0.5.0"
	# lhotse and deepspeed declare an unpinned torch: install them without deps so torch stays
	# as chosen (their own dependencies by name). deepspeed builds against the installed torch
	# (no build isolation) with no CUDA ops (DS_BUILD_OPS=0): its configs and estimators run on CPU.
	$(BIN)/python -m pip install -q --no-deps "lhotse==1.33.0" audioread cytoolz toolz intervaltree tabulate urllib3
	$(BIN)/python -m pip install -q hjson ninja py-cpuinfo msgpack einops "pydantic>=2" psutil
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-deps --no-build-isolation "deepspeed==0.19.8"
	touch $@

# The demo: a corpus, the plan for a named GPU, then a few minutes of training on this machine
# (planned for what is here: the CPU, or the GPU if there is one), scored on dev and test,
# ending with $(DEMO_RUN)/report.html (memory, durations and buckets, loss and WER/CER, speed).
demo: $(VENV)/.installed
	$(BIN)/asrfit demo-data $(DEMO_DIR) --overwrite
	$(BIN)/asrfit plan --model $(DEMO_MODEL) --data $(DEMO_DIR)/train.jsonl --gpu $(DEMO_GPU) --target-batch 8
	$(BIN)/asrfit train --model $(DEMO_MODEL) --data $(DEMO_DIR)/train.jsonl --dev $(DEMO_DIR)/dev.jsonl \
		--test $(DEMO_DIR)/test.jsonl --gpu auto --out $(DEMO_RUN) --target-batch 8 --epochs 4 --lr 1e-3 \
		--random-init $(DEMO_TRAIN_ARGS)
	$(BIN)/asrfit memory --model wav2vec2-base --batch 8 --seconds 16 --gpu $(DEMO_GPU)
	$(BIN)/asrfit report $(DEMO_RUN)

# kenlm builds from source (about a minute on 2 busy cores; it needs a C++ compiler, and
# Boost/zlib are optional); without it the beam search runs with no n-gram.
$(VENV)/.kenlm: | $(VENV)/.installed
	$(BIN)/python -m pip install -q "kenlm==0.3.0" || echo "kenlm did not build: beam search without an n-gram"
	touch $@

# flite and Festival (Debian packages; apt-get, as root or through sudo) speak the speech corpus
# beside espeak-ng (a wheel). Where they cannot be installed, the speech corpus cannot be written
# and its tests are skipped, with this reason listed by pytest -rs.
SPEECH_DEBS := flite festival festvox-kdlpc16k festvox-us-slt-hts
$(VENV)/.speech-engines: | $(BIN)/python
	@dpkg -s $(SPEECH_DEBS) >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q $(SPEECH_DEBS) || \
	  { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q $(SPEECH_DEBS); } || \
	  echo "flite/Festival not installed: no speech corpus; its tests will be skipped"; }
	touch $@

# Speech that sounds like speech: espeak-ng's and flite's voices with perturbations, rooms,
# noise and channels; dev/test sentences and espeak-ng voices never seen in training, and a
# whole engine (Festival) held out (docs/benchmarks.md).
demo-speech: $(VENV)/.installed $(VENV)/.kenlm $(VENV)/.speech-engines
	$(BIN)/asrfit demo-data --speech $(SPEECH_DIR) --workers 2 --overwrite
	$(BIN)/asrfit train --model $(SPEECH_MODEL) --data $(SPEECH_DIR)/train.jsonl --dev $(SPEECH_DIR)/dev.jsonl \
		--test $(SPEECH_DIR)/test.jsonl --gpu auto --out $(SPEECH_RUN) --random-init $(SPEECH_TRAIN_ARGS)
	$(BIN)/python -m bench speech_demo --run $(SPEECH_RUN) --data $(SPEECH_DIR) --out docs/benchmarks.md
	$(BIN)/asrfit report $(SPEECH_RUN)

# -rs lists every skipped test with its reason at the end: on a machine without a GPU only
# the GPU tests should be there.
test: $(VENV)/.installed $(VENV)/.kenlm $(VENV)/.speech-engines
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/python -m pytest -rs

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

# Benchmarks write their sections of docs/benchmarks.md (the command sits beside each figure).
# The headline set and its order: bench/__main__.py (HEADLINE); `python -m bench --list` lists all.
bench: $(VENV)/.installed
	$(BIN)/python -m bench headline

clean:
	rm -rf $(VENV) $(DEMO_DIR) $(DEMO_RUN) $(SPEECH_DIR) $(SPEECH_RUN) build dist src/*.egg-info
