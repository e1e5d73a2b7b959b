# Two commands for a fresh clone:  `make demo`  and  `make test`.
# Both create .venv on first use (torch==2.13.0 CPU build first, so pip never picks a CUDA build).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck unit docs bench bench-smoke pictures spec check-tools

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m wandb_modprof demo

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check wandb_modprof tests benchmarks tools examples
	$(VENV)/bin/ruff format --check wandb_modprof tests benchmarks tools examples

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

# One pytest worker per core (pytest-xdist), a test file per worker at a time (its module
# fixtures are built once); --durations lists the slowest, to keep the suite in budget. Then
# the `accuracy` tests alone, serially: their timings need the cores to themselves (exit 5:
# no test has the mark).
unit: $(VENV)/.installed
	$(PY) -m pytest -q -n auto --dist loadfile --durations=15 -m "not accuracy"
	$(PY) -m pytest -q -m accuracy || test $$? -eq 5

# Each benchmark's smallest run, only to prove that the script still runs (its numbers are
# `make bench`'s job): two at a time, one line each; a failing one prints all it wrote.
BENCH_SMOKE := overhead structure layout report peers accuracy scale gpu distributed hook_floor thread_cpu meter checkpoint wandb_log profile_file phases
# (gpu.py's dry run on CPU: one model; peers.py --quick runs all three through the same code)
BENCH_SMOKE_ARGS = $(if $(filter gpu,$*),--dry-run --models resnet,$(if $(filter hook_floor,$*),--modules 400,--quick))

bench-smoke: $(VENV)/.installed
	@$(MAKE) --no-print-directory -j2 $(addprefix bench-smoke/,$(BENCH_SMOKE))

bench-smoke/%:
	@log=$$(mktemp); start=$$(date +%s); \
	if $(PY) benchmarks/$*.py $(BENCH_SMOKE_ARGS) >$$log 2>&1; then \
		echo "bench-smoke: benchmarks/$*.py $(BENCH_SMOKE_ARGS) ok ($$(( $$(date +%s) - start )) s)"; rm -f $$log; \
	else \
		cat $$log; rm -f $$log; echo "bench-smoke: benchmarks/$*.py $(BENCH_SMOKE_ARGS) FAILED"; exit 1; \
	fi

# The documentation site (mkdocs.yml, docs/): --strict turns every warning into an error: a broken
# link or anchor, a missing page, a docstring the API reference cannot render, and (the hook
# tools/site_links.py) a link or picture of the built site that does not resolve, raw HTML
# included. Nothing hides the warnings (no --quiet). The site goes to site/ (ignored).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# What the test command needs beyond Python, checked before anything runs: Debian's chromium
# for the panel's browser tests, and npm to fetch Vega 5 for them (once: tests/.vendor/).
CHROMIUM ?= $(or $(MODPROF_CHROMIUM),/usr/bin/chromium)
check-tools:
	@missing=""; \
	[ -x "$(CHROMIUM)" ] || missing="$$missing\n  chromium: the panel's browser tests drive Debian's $(CHROMIUM) (apt-get install chromium fonts-liberation fonts-dejavu-core)"; \
	[ -f "$(VEGA_JS)" ] || command -v npm >/dev/null || missing="$$missing\n  npm: fetches Vega $(VEGA_VERSION) into tests/.vendor/ for those tests (apt-get install npm)"; \
	command -v c++ >/dev/null || missing="$$missing\n  c++: the compiled-model tests run torch.compile's inductor, which compiles C++ kernels on CPU (apt-get install g++)"; \
	if [ -n "$$missing" ]; then printf "make test needs what is missing here:$$missing\n" >&2; exit 1; fi

test: check-tools lint typecheck docs unit bench-smoke

# Every benchmark, then docs/performance.md from their output (results kept in docs/bench/);
# `make bench BENCH=overhead` (or BENCH=overhead,peers) reruns only those sections.
bench: $(VENV)/.installed
	$(PY) tools/bench_page.py $(if $(BENCH),--only $(BENCH))

# The suite under the newest torch that installs here (COMPAT_TORCH=2.14.1: the registry's CUDA
# build, ~5 GB, runs on CPU) in its own venv .venv-compat/; browser tests and notebook left out.
# Not part of `make test` or .ci/run; its last result is in the README (Tested torch versions).
COMPAT_TORCH ?= 2.14.1
.PHONY: compat
compat:
	PYTHON=$(PYTHON) tools/compat.sh $(COMPAT_TORCH)

pictures: $(VENV)/.installed
	$(PY) tools/render_layout.py --out docs/images
	$(PY) tools/render_panel.py --out docs/images

# Regenerate the panel's Vega spec vega_specs/modprof.vg.json from tools/build_spec.py and its
# parts in tools/spec/ (tests/sinks/test_spec_render.py checks the committed file is up to date).
spec: $(VENV)/.installed
	$(PY) tools/build_spec.py

# Vega 5 for the panel's browser tests (tests/sinks/test_spec_browser.py): W&B's panel runs vega ^5.24.0,
# which its lockfile (wandb/weave weave-js/yarn.lock) resolves to 5.25.0: the version tested here.
# npm checks the tarball against the registry's integrity hash; the sha256 pins the file itself.
VEGA_VERSION := 5.25.0
VEGA_SHA256 := 9dadae3edfad50f57b19156973efdecd08fe946c258c8bce2627e49a0f1fddab
VEGA_JS := tests/.vendor/vega-$(VEGA_VERSION).min.js

.PHONY: vendor
vendor: $(VEGA_JS)
unit: vendor

$(VEGA_JS):
	rm -rf tests/.vendor/pack && mkdir -p tests/.vendor/pack
	npm pack --silent --pack-destination tests/.vendor/pack vega@$(VEGA_VERSION) >/dev/null
	tar -xzf tests/.vendor/pack/vega-$(VEGA_VERSION).tgz -C tests/.vendor/pack package/build/vega.min.js
	$(PYTHON) -c "import hashlib, sys; h = hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest(); sys.exit(0 if h == '$(VEGA_SHA256)' else 'vega.min.js sha256 ' + h + ', expected $(VEGA_SHA256)')" tests/.vendor/pack/package/build/vega.min.js
	mv tests/.vendor/pack/package/build/vega.min.js $@
	rm -rf tests/.vendor/pack
