# neoxlab: `make run` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXP ?= local_compare
# Hydra overrides given after EXP (make sees key=value words as variables; pass them on).
OVERRIDES := $(filter-out EXP=% RUN=% PYTHON=% TESTS=%,$(MAKEOVERRIDES))
TESTS ?= tests

.PHONY: help install neox-env neox-checkout run resume status collect figures test lint bench omb-compare \
  slurm-up slurm-down clean-venv nvrtc test-oldest

help: ## list targets and experiments
	@echo "targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sed 's/^/  /'
	@echo "experiments (make run EXP=<name> [hydra.overrides ...]):"
	@for f in experiments/*.yaml; do n=$$(basename $$f .yaml); \
	  d=$$(grep -m1 '^description:' $$f | sed 's/description: *//'); printf '  %-20s %s\n' "$$n" "$$d"; done

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m neoxlab.serve.native_attention  # serve's decode-attention kernel, built once (~30 s)
	touch $(STAMP)

install: $(STAMP) ## create .venv and install pinned dependencies (no-op when up to date)

# engine=neox: what a GPT-NeoX checkout needs to import train.py and build its dataset helpers
# (pyproject.toml [neox]); rank 0 of a job builds the helpers with this venv's python.
neox-env: $(STAMP) ## add GPT-NeoX's extra needs (engine=neox) to .venv
	$(PY) -m pip install -q -e '.[dev,neox]'

# The vendored GPT-NeoX (patches/upstream.lock's commit) unpacked into the git-ignored
# build/gpt-neox, where experiments/local_neox*.yaml look for it (cluster.neox_dir).
NEOX_TARBALL ?= ../shared/vendor/gpt-neox-ea7aefd8.tar.gz
neox-checkout: build/gpt-neox/train.py ## unpack the vendored GPT-NeoX into build/gpt-neox
build/gpt-neox/train.py:
	@test -f $(NEOX_TARBALL) || { echo "no $(NEOX_TARBALL): give NEOX_TARBALL=<gpt-neox tar.gz> or cluster.neox_dir=<checkout>" >&2; exit 2; }
	mkdir -p build && tar -xzf $(NEOX_TARBALL) -C build && touch $@

run: $(STAMP) ## run experiment EXP (default local_compare) with Hydra overrides after it
	$(PY) -m neoxlab experiment=$(EXP) $(OVERRIDES)

status: $(STAMP) ## runs of EXP, their scheduler jobs and states (results/manifests/<exp>.jsonl)
	$(PY) -m neoxlab.commands.status $(EXP)

resume: $(STAMP) ## continue a stopped local training run: make resume RUN=results/<exp>/<run_id>
	@test -n "$(RUN)" || { echo "usage: make resume RUN=results/<experiment>/<run_id>" >&2; exit 2; }
	$(PY) -m neoxlab resume $(RUN)

# EXP defaults to local_compare for `run`; collect/figures act on every experiment unless EXP is given.
EXP_ARG := $(if $(filter command line,$(origin EXP)),--exp $(EXP))

collect: $(STAMP) ## run dirs -> results/tables/<exp>.*.parquet (every experiment, or EXP=<name>)
	$(PY) -m neoxlab.results.tables $(EXP_ARG)

figures: $(STAMP) ## collect missing/stale tables, then analysis/ notebooks -> results/figures/
	$(PY) -m neoxlab.results.figures $(EXP_ARG)

# Unit tests on 2 pytest-xdist workers (half the time on 2 cores); the multi-rank tests one
# at a time (each already keeps every core busy). Both always run; either failing fails.
test: $(STAMP) ## run the test suite (TESTS=<paths> runs only those, in one process)
ifeq ($(TESTS),tests)
	@unit=0; $(PY) -m pytest -q -n 2 --durations=10 tests/unit || unit=$$?; \
	  $(PY) -m pytest -q --durations=25 tests/integration && exit $$unit
else
	$(PY) -m pytest -q --durations=25 $(TESTS)
endif

# NVRTC for the CUDA C codecs' compile tests (tests/unit/test_nvrtc_codecs.py): 11.8 (Lassen's
# CUDA, sm_70) and 12.x (sm_90). Both wheels install to nvidia/cuda_nvrtc/lib, so each gets its
# own --target directory; the tests load libnvrtc from there by path.
NVRTC_CU11 := nvidia-cuda-nvrtc-cu11==11.8.89
NVRTC_CU12 := nvidia-cuda-nvrtc-cu12==12.9.86
nvrtc: build/nvrtc/cu11/.installed build/nvrtc/cu12/.installed ## NVRTC 11.8 + 12.9 wheels into build/nvrtc/

build/nvrtc/%/.installed: | $(STAMP)
	rm -rf build/nvrtc/$*
	$(PY) -m pip install -q --no-deps --target build/nvrtc/$* $(if $(filter cu11,$*),$(NVRTC_CU11),$(NVRTC_CU12))
	touch $@

# neoxlab's own code on the oldest supported set (pyproject.toml [tool.neoxlab.oldest]: torch
# 2.1.2, DeepSpeed 0.10.0, Python 3.11), in its own venv: the unit tests that need no
# megatron-core. Run before each release; not in CI: torch 2.1.2 is a 670 MB wheel plus
# ~2.5 GB of CUDA wheels (PyPI has no CPU-only build of it), docs/clusters.md.
OLDEST_VENV := build/venv-oldest
OLDEST_PIP := torch==2.1.2 deepspeed==0.10.0 "numpy<2" pandas==2.2.3 pyarrow==17.0.0 \
  hydra-core==1.3.8 omegaconf==2.3.1 zfpy==1.0.1.post0 mpi4py==4.1.2 mpich==5.0.2 psutil==7.2.2 \
  tqdm==4.70.1 pytest==9.2.0 pytest-timeout==2.4.0 jupytext==1.19.6 nbclient==0.11.0 \
  matplotlib==3.11.2
OLDEST_TESTS := tests/unit/test_compressors.py tests/unit/test_fixed_payloads.py \
  tests/unit/test_zfp_torch.py tests/unit/test_nvrtc_codecs.py tests/unit/test_codec_kernel_choice.py \
  tests/unit/test_mpi_group.py tests/unit/test_side_stream.py tests/unit/test_lassen_mpi_flags.py
test-oldest: ## unit tests without megatron-core on the oldest torch/DeepSpeed/Python (build/venv-oldest)
	test -x $(OLDEST_VENV)/bin/python || python3.11 -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q $(OLDEST_PIP)
	PYTHONPATH=src $(OLDEST_VENV)/bin/python -c "import torch, deepspeed, sys; \
	  print('oldest set:', sys.version.split()[0], 'torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
	PYTHONPATH=src $(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider $(OLDEST_TESTS)

lint: $(STAMP) ## ruff
	$(VENV)/bin/ruff check src tests bench studies analysis

bench: $(STAMP) ## benchmarks that print side-by-side ratios
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

OMB_NATIVE := build/omb_native

# rebuilt only when the C source changes (the mpich wheel's mpicc, see neoxlab/omb/native.py)
$(OMB_NATIVE): bench/native/omb_native.c | $(STAMP)
	$(PY) -m neoxlab.omb.native $< $@

omb-compare: $(OMB_NATIVE) ## native C vs Python latency/allreduce on 2 ranks, overhead verdict
	$(PY) bench/omb_compare.py --native $(OMB_NATIVE)

slurm-up: ## start the local single-node Slurm (EXP=local_slurm, Slurm tests); root, idempotent
	bash .ci/slurm-up

slurm-down: ## stop the local Slurm daemons
	bash .ci/slurm-down

clean-venv: ## remove the virtual environment
	rm -rf $(VENV)
