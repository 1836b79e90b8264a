# make run   : create .venv, install everything, train DQN on CartPole-v1 with the default plan
# make test  : create .venv if missing, run the test suite
# GPU users  : make install TORCH_INDEX=https://download.pytorch.org/whl/cu126  (any CUDA build of torch 2.13.0)
# CPU-only machines elsewhere: TORCH_INDEX=https://download.pytorch.org/whl/cpu avoids the CUDA wheels
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= test

.PHONY: install run test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned, so nothing below pulls another (CUDA) build
	$(BIN)/pip install $(TORCH) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -e '.[$(EXTRAS)]'
	# the CPU learner kernel compiled into numba's cache now, so that no run waits for it
	-$(BIN)/hetrl warm
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/hetrl train dqn --env CartPole-v1 --out runs/quickstart --force

test: install
	$(BIN)/python -m pytest -n 2 --dist loadfile

bench: install
	$(BIN)/pip install -e '.[bench]'
	$(BIN)/python benchmarks/bench_sb3.py

clean:
	rm -rf $(VENV) runs .pytest_cache
