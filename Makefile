VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run test proto clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

run: venv
	$(VENV)/bin/bascule server --embedded-nats --raft-bootstrap-seed -d ./data --port 9292

test: venv
	$(PY) -m pytest -q $(PYTEST_ARGS)

proto: venv
	$(PY) -m bascule.wire.generate

clean:
	rm -rf $(VENV) data
