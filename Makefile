# `make demo` and `make test` each create .venv from pyproject.toml on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The checkout is installed editable in setuptools' strict mode: a tree of links to its files
# (build/__editable__.*) goes on sys.path, so `import jaxsal` finds the package even where the
# working directory holds a folder named jaxsal (a clone's own folder, in a notebook started in
# its parent); the default editable mode loses to the empty namespace package that folder makes.
# The links are per file, so a module added or removed relinks (the package folders' times).
PKG_DIRS := $(shell find jaxsal agents -type d -not -name __pycache__ 2>/dev/null)
EDITABLE := --config-settings editable_mode=strict
# setuptools warns at every strict editable install that build/__editable__.* must stay: said here once
PIP := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip

$(BIN)/jaxsal: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e ".[test,agents]" $(EDITABLE)
	touch $(BIN)/jaxsal $(VENV)/.linked

$(VENV)/.linked: $(BIN)/jaxsal $(PKG_DIRS)
	$(PIP) install --quiet --no-deps -e . $(EDITABLE)
	touch $(VENV)/.linked

.PHONY: venv demo test test-slow docs docs-serve chromium
venv: $(VENV)/.linked

demo: venv
	$(BIN)/jaxsal demo

test: venv
	$(BIN)/python -m pytest -q -n 2

# the slow tests also run the real clients: Dopamine's own replay buffer (tensorflow), and models
# trained and saved by Stable-Baselines3 and SBX (torch: its CPU build, 2.13.0, which pip takes
# from this machine's wheel folder), and Captum beside that torch (with scikit-learn, which its Lime
# fits with) for docs/guides/from-captum.md's Captum rows; pytorch-grad-cam (and ttach, OpenCV) without
# its dependencies: it asks for torchvision, which does not load beside the CPU torch, and imports it only
# in utilities its Grad-CAM path never calls (the peer benchmark puts a stand-in in its place). Installed
# here only, so `make test` keeps the base dependencies
$(VENV)/.clients-extra: $(BIN)/jaxsal
	$(PIP) install --quiet "torch==2.13.0" "captum>=0.7,<1" "scikit-learn>=1.3,<2"
	$(PIP) install --quiet --no-deps "grad-cam==1.5.7" "ttach==0.0.3" "opencv-python-headless>=4.8,<6"
	$(PIP) install --quiet -e ".[test,clients]" $(EDITABLE)
	# dopamine-rl pulls tensorflow-probability 0.25, whose files overwrite the tfp-nightly that
	# sbx-rl needs (0.25's JAX substrate fails on this jax): put tfp-nightly's files back
	$(PIP) install --quiet --force-reinstall --no-deps tfp-nightly
	touch $@

# `jaxsal sweep --ray local` is tested with a real local Ray instance (the ray extra)
$(VENV)/.ray-extra: $(BIN)/jaxsal
	$(PIP) install --quiet -e ".[test,ray]" $(EDITABLE)
	touch $@

# tests/docs/test_browser.py opens the built site in the system's Chromium: installed here with apt where it
# is missing and this is root (CI's fresh machines); elsewhere the line says how, and the test skips
# outside CI. playwright (the browser extra) drives it and never downloads a browser of its own.
$(VENV)/.browser-extra: $(BIN)/jaxsal
	$(PIP) install --quiet -e ".[test,browser]" $(EDITABLE)
	touch $@

chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "Chromium is missing (tests/docs/test_browser.py): sudo apt-get install chromium"; fi; }

test-slow: venv $(VENV)/.clients-extra $(VENV)/.docs-extra $(VENV)/.ray-extra $(VENV)/.browser-extra chromium
	$(BIN)/python -m pytest -q -m slow

# the documentation site: mkdocs.yml and docs/, the docstrings (mkdocstrings) and the notebooks with their
# committed outputs (mkdocs-jupyter, nothing executed); built into site/ (git-ignored), warnings are errors
$(VENV)/.docs-extra: $(BIN)/jaxsal
	$(PIP) install --quiet -e ".[test,docs]" $(EDITABLE)
	touch $@

docs: venv $(VENV)/.docs-extra
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: venv $(VENV)/.docs-extra
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve
