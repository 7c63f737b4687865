# The two commands a newcomer runs on a fresh Debian machine:
#   make demo   set up, build, and show margay working
#   make test   set up, build, and run the whole test suite (unit, property, integration, root)
SHELL := /bin/bash
CARGO ?= cargo
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
MARGAY := $(TARGET_DIR)/release/margay

.PHONY: all setup build release test lint fmt bench demo clean

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

test: lint
	$(CARGO) test --workspace --no-fail-fast

fmt:
	$(CARGO) fmt --all

bench: setup
	$(CARGO) bench -p margay-selector --bench eval

demo: release
	@MARGAY=$(MARGAY) scripts/demo

clean:
	$(CARGO) clean
