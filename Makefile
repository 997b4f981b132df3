# Two entry points: `make demo` trains PPO on CartPole and writes a plot; `make test` runs lint,
# types and tests. Both create .venv and install from the project's own files.
# `make test-numerics` reruns the learning tests under other CPU kernels and BLAS paths, as
# another machine would run them; `make bench` reruns the benchmarks.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP_INSTALL := $(BIN)/pip install --quiet --constraint constraints.txt

.PHONY: demo test test-numerics lint pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.demo-installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.dev-installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP_INSTALL) -e '.[dev]'
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/rlfleet train ppo --env CartPole-v1 --run-dir runs/demo-ppo-cartpole --force

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy rlfleet
	$(BIN)/lint-imports --no-logo

pytest: $(VENV)/.dev-installed
	$(BIN)/pytest -n 2 --dist loadfile

# Lint and types run beside the tests: mypy keeps one core busy for a minute, and the tests
# leave about a sixth of two cores idle while they wait on subprocesses and Ray actors.
# `make test` fails if either fails.
test: $(VENV)/.dev-installed
	$(MAKE) --no-print-directory -j 2 lint pytest

# Each setting changes the floating-point path (MKL's code path, ATen's vectorised kernels),
# so every learning test (marked `slow`) follows another trajectory, as on another CPU.
NUMERICS := MKL_CBWR=AVX2 MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default
test-numerics: $(VENV)/.dev-installed
	@set -e; for setting in $(NUMERICS); do \
		echo "== learning tests under $$setting"; \
		env $$setting $(BIN)/pytest -m slow -n 2 --dist loadfile; \
	done

bench: $(VENV)/.dev-installed
	$(PIP_INSTALL) -e '.[dev,bench]'
	# The README's speed table: each comparison at one and two torch threads, SAC at two (on
	# the Intel Xeon both libraries ran it fastest there; three pairs at RL-Zoo's 20k steps
	# take about 20 minutes on two cores). A run replaces this machine's figures at the
	# counts it measures: add `--bf16` on a CPU with AVX-512 BF16 or AMX to keep a bf16 row.
	$(BIN)/python bench/ppo_cartpole.py --threads 1,2
	$(BIN)/python bench/dqn_cartpole.py --threads 1,2
	$(BIN)/python bench/sac_pendulum.py --threads 2
	$(BIN)/python bench/ppo_atari.py --threads 1,2
	$(BIN)/python bench/offline_pendulum.py --seeds 3
	$(BIN)/python bench/gail_pendulum.py --jobs 2
	$(BIN)/python bench/reference_tasks.py
	# 200 SIGKILLs at random moments across PPO, DQN, SAC and a multi-agent run, each resumed.
	$(BIN)/python bench/soak.py --kills 200

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
