# The two commands a newcomer runs on a fresh Debian machine:
#   make demo   set up, build, and show margay working
#   make test   set up, build, and run the whole test suite (unit, property, integration, root)
SHELL := /bin/bash
CARGO ?= cargo
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
MARGAY := $(TARGET_DIR)/release/margay

.PHONY: all setup build release test lint fmt bench fuzz demo clean

all: build

setup:
	@scripts/setup

build: setup
	$(CARGO) build --workspace

release: setup
	$(CARGO) build --release -p margay

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	cargo machete
	cargo deny --log-level error check licenses bans sources

test: lint
	$(CARGO) test --workspace --no-fail-fast

fmt:
	$(CARGO) fmt --all

# `make test` fuzzes each parser for 12 s (fuzz/tests/fuzz.rs); this runs them longer, optimised:
# FUZZ_SECS per target (default 300), MARGAY_FUZZ_SEED to repeat a run.
fuzz: setup
	$(CARGO) run --release -p margay-fuzz -- --secs $(or $(FUZZ_SECS),300)

bench: setup
	$(CARGO) bench -p margay-selector --bench eval

demo: release
	@MARGAY=$(MARGAY) scripts/demo

clean:
	$(CARGO) clean
