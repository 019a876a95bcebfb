# Two commands do all the set-up on a fresh machine: `make demo` (train + evaluate on embedded data) and
# `make test`. Both create .venv first if it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-slow lint docs docs-serve bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,docs]'
	touch $@

demo: setup
	$(BIN)/vitlab train --out runs/demo --resume auto

# One pytest worker per core (pytest-xdist); a test file stays on one worker, so its module fixtures run once.
test: setup
	$(BIN)/python -m pytest -n auto --dist loadfile

test-slow: setup
	$(BIN)/python -m pytest -m slow

lint: setup
	$(BIN)/ruff check .
	PYTHONPATH=. $(BIN)/lint-imports  # the contracts cover reproduction/, beside src/

# The documentation site (docs/, mkdocs.yml) into build/site; --strict: a broken link or API reference fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The site at http://127.0.0.1:8000, rebuilt on every edit; search needs no network here.
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

bench: setup
	$(BIN)/vitlab bench --model ViT-S/16 --batch-size 32 --compare timm

clean:
	rm -rf $(VENV) runs build *.egg-info
