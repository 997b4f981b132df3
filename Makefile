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
	$(BIN)/python bench/ppo_cartpole.py
	$(BIN)/python bench/dqn_cartpole.py
	# Half of RL-Zoo's 20k SAC steps: three alternating pairs at 20k take 40 minutes on two cores.
	$(BIN)/python bench/sac_pendulum.py --steps 10000
	$(BIN)/python bench/ppo_atari.py
	$(BIN)/python bench/offline_pendulum.py --seeds 3
	$(BIN)/python bench/gail_pendulum.py --jobs 2
	$(BIN)/python bench/reference_tasks.py
	# 200 SIGKILLs at random moments across PPO, DQN, SAC and a multi-agent run, each resumed.
	$(BIN)/python bench/soak.py --kills 200

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
