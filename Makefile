# mq-gateway: `make run` starts everything locally, `make test` runs the suite (`make test-fast`: the
# unit tests and a smoke test), `make lint` runs ruff, mypy and the import contracts (`make format`
# applies ruff's safe fixes), `make bench` measures.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
APT_GET := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || echo sudo apt-get)

.PHONY: run test test-unit test-tansu test-kafka test-rocketmq test-fast test-deps chaos bench soak deps system lint format clean

deps: system $(STAMP)

# Debian packages `make run` needs: redis-server, and Java with Maven (Apache Kafka, the default
# broker of `make run`, is started from its Maven Central jars). Venv support for python3 comes
# with the venv itself, so that `make lint` needs nothing else.
system:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (Debian package)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq redis-server >/dev/null; \
	  (systemctl disable --now redis-server || service redis-server stop) >/dev/null 2>&1 || true; }
	@command -v java >/dev/null 2>&1 || { \
	  echo "installing a Java runtime (Debian package; the PySpark report job needs it)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq openjdk-17-jre-headless >/dev/null; }
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "installing maven (Debian package; Apache Kafka is started from its Maven Central jars)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq maven >/dev/null; }

# What only the tests need, kept out of `make run`: an apt lock held elsewhere, or a slow mirror,
# must not stop the gateway from starting.
test-deps: deps
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package; tests render the lag report with it)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium >/dev/null; }
	@command -v chromedriver >/dev/null 2>&1 || { \
	  echo "installing chromium-driver (Debian package; tests drive the console in Chromium with Selenium)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium-driver >/dev/null; }
	@command -v node >/dev/null 2>&1 || { \
	  echo "installing nodejs (Debian package; the tests run the JavaScript client examples)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq nodejs >/dev/null; }
	@command -v javac >/dev/null 2>&1 || { \
	  echo "installing a JDK (Debian package; the tests compile the Java client examples)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq openjdk-17-jdk-headless >/dev/null; }
	@command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || { \
	  echo "installing Go (Debian package; the tests build the Go client examples)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq golang-go >/dev/null; }

$(BIN)/python:
	@$(PY) -c "import ensurepip, venv" >/dev/null 2>&1 || { \
	  echo "installing python3-venv (Debian package)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq python3-venv >/dev/null; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $@

run: deps
	$(BIN)/python -m gateway dev

# The tests are in three folders (tests/conftest.py): tests/unit runs in process (fakeredis with
# the real Lua scripts, the memory broker), tests/system starts processes, tests/support is shared.
# `make test`: the unit tests; every system test on Apache Kafka from its Maven jars (the
# reference broker); then on Tansu (the stand-in that starts in milliseconds) and on Apache
# RocketMQ the system tests marked every_broker, which prove the broker adapter (and on RocketMQ
# its own, marked rocketmq): the rest does not depend on the broker, so it runs once. All passes run, so one failing does not hide the others' results. With
# KAFKA_BOOTSTRAP set (an external broker) it runs once, everything, against that broker.
test: test-deps
	@if [ -n "$$KAFKA_BOOTSTRAP" ]; then $(BIN)/python -m pytest -q $(PYTEST_ARGS); exit $$?; fi; \
	rc=0; \
	echo "== unit tests (in process)"; $(MAKE) --no-print-directory test-unit || rc=1; \
	echo "== system tests on Apache Kafka"; $(MAKE) --no-print-directory test-kafka || rc=1; \
	echo "== system tests of the broker adapter on Tansu"; $(MAKE) --no-print-directory test-tansu || rc=1; \
	echo "== system tests of the broker adapter on Apache RocketMQ"; $(MAKE) --no-print-directory test-rocketmq || rc=1; \
	exit $$rc

# schemathesis' and hypothesis' pytest plugins take seconds to import; no unit test uses them.
UNIT_PYTEST := -p no:cacheprovider -p no:schemathesis -p no:hypothesispytest

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q $(UNIT_PYTEST) tests/unit $(PYTEST_ARGS)

test-kafka: test-deps
	MQGW_TEST_BROKER=kafka $(BIN)/python -m pytest -q -p no:cacheprovider tests/system $(PYTEST_ARGS)

test-tansu: test-deps
	MQGW_TEST_BROKER=tansu $(BIN)/python -m pytest -q -p no:cacheprovider -m every_broker tests/system $(PYTEST_ARGS)

# Apache RocketMQ 5.5.0 from its Maven jars (gateway/cli/rocketmq_dist.py): the adapter's tests,
# and RocketMQ's own (interoperability with its Java and C++ clients, its tools, a killed broker).
test-rocketmq: test-deps
	MQGW_TEST_BROKER=rocketmq $(BIN)/python -m pytest -q -p no:cacheprovider -m "every_broker or rocketmq" tests/system $(PYTEST_ARGS)

# The fault suite (issue 32): a node's process under faults made on purpose (a fenced broker,
# SIGSTOPped workers, CPU burners, a failed bind, SIGTERM under load) on Apache Kafka, then the
# RocketMQ cases. `make test` runs the same tests in its passes.
chaos: test-deps
	@rc=0; \
	MQGW_TEST_BROKER=kafka $(BIN)/python -m pytest -q -p no:cacheprovider -m chaos tests/system $(PYTEST_ARGS) || rc=1; \
	MQGW_TEST_BROKER=rocketmq $(BIN)/python -m pytest -q -p no:cacheprovider -m "chaos and (every_broker or rocketmq)" tests/system $(PYTEST_ARGS) || rc=1; \
	exit $$rc

# The inner loop: the unit tests and one system smoke test (two nodes, Redis, Tansu).
test-fast: deps
	$(BIN)/python -m pytest -q $(UNIT_PYTEST) tests/unit tests/system/test_smoke.py $(PYTEST_ARGS)

# All three run, so one failing does not hide what the others find; configured in pyproject.toml.
# Only the venv is needed (no apt-get: no redis-server, Java or Maven).
lint: $(STAMP)
	@rc=0; \
	echo "ruff check"; $(BIN)/ruff check . || rc=1; \
	echo "mypy"; $(BIN)/mypy || rc=1; \
	echo "lint-imports"; $(BIN)/lint-imports || rc=1; \
	exit $$rc

# ruff's safe fixes (import order, pyupgrade, ...). Not `ruff format`: the code is laid out by
# hand (tables, aligned arguments), and `ruff format` would rewrite most files.
format: $(STAMP)
	$(BIN)/ruff check --fix .

bench: deps
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# Minutes of steady produce/delay/nack load through two nodes (Apache Kafka by default); fails if
# Redis keys or memory grow with the records delivered, a record is lost or a 5xx is answered.
# Not part of CI. E.g. SOAK_ARGS="--minutes 10 --broker tansu --json".
soak: deps
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
