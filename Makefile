# Vigil developer commands. `make demo` and `make test` are the two a new user needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KAFKA_PORT ?= 9092
export KAFKA_PORT
# the dev broker's secured listeners and credentials (written by dev-kafka.sh start)
KAFKA_SECURITY = $${VIGIL_KAFKA_RUN:-/tmp/vigil-kafka-$(KAFKA_PORT)}/security.json

.PHONY: demo test chart-files docs-check lint format bench kafka-start kafka-stop clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,dask]'
	touch $(STAMP)

## demo: run the daemon pipeline on the bundled COMPAS stream (files, no broker), print the alert summary
demo: $(STAMP)
	$(VENV)/bin/vigil demo

## test: lint, bring helm and the CRD schemas (once, cached), start the dev Kafka broker,
## run the whole suite (tests/run_suite.sh: the broker tests beside the others), stop the
## broker (a broker that was already running on $(KAFKA_PORT) is left running); without Go
## or npm the chart tests that need them skip
test: $(STAMP)
	$(VENV)/bin/ruff check .
	helm=$$(bash ops/helm/get.sh helm) || helm=; \
	crd_models=$$(bash ops/helm/get.sh crd-models) || crd_models=; \
	broker=; trap '[ "$$broker" != started ] || bash ops/kafka/dev-kafka.sh stop' EXIT; \
	broker=$$(bash ops/kafka/dev-kafka.sh start) && \
	VIGIL_KAFKA_BOOTSTRAP=127.0.0.1:$(KAFKA_PORT) VIGIL_KAFKA_SECURITY=$(KAFKA_SECURITY) \
	VIGIL_HELM=$$helm VIGIL_CRD_MODELS=$$crd_models PYTHON=$(PY) bash tests/run_suite.sh

## chart-files: copy the alert rules and the dashboard into the Helm chart (a test fails
## while they differ)
chart-files:
	cp ops/prometheus/alerts.yml ops/helm/vigil/files/alerts.yml
	cp ops/grafana/vigil-dashboard.json ops/helm/vigil/files/vigil-dashboard.json

## docs-check: run every command the docs show (README, docs/operations.md, ops/README.md) and print what ran
docs-check: $(STAMP)
	broker=; trap '[ "$$broker" != started ] || bash ops/kafka/dev-kafka.sh stop' EXIT; \
	broker=$$(bash ops/kafka/dev-kafka.sh start) && \
	VIGIL_KAFKA_BOOTSTRAP=127.0.0.1:$(KAFKA_PORT) VIGIL_KAFKA_SECURITY=$(KAFKA_SECURITY) \
	$(PY) -m pytest -q -s tests/test_docs_commands.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

## bench: the i.o.r. benchmarks recorded in docs/benchmarks.md (needs ../shared/data)
bench: $(STAMP)
	$(PY) bench/ior_bench.py
	$(PY) bench/ior_bench.py --scaling

kafka-start:
	bash ops/kafka/dev-kafka.sh start

kafka-stop:
	bash ops/kafka/dev-kafka.sh stop

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis vigil-demo
