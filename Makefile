VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# CONTAINERS=0 leaves out the tests marked `containers` (and the engine setup they need).
CONTAINERS ?= 1

.PHONY: venv bytecode run test check soak simulate containers fuse faketime promtool proto clean

venv: $(STAMP)

$(STAMP): pyproject.toml src/bascule/wire/_walk.c src/bascule/natsio/_frames.c
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

# Bytecode for bascule's own modules: pip compiles an installed package, not an editable one, and
# where PYTHONDONTWRITEBYTECODE is set (this machine, many CI images) every node process would
# compile them again at its start (0.15 s of a 0.4 s start). The same for the code dataclasses
# generate (bascule.dataclass_code: 50-70 ms of a start).
bytecode: venv
	$(PY) -m compileall -q src/bascule > /dev/null
	$(PY) -m bascule.dataclass_code

run: venv bytecode
	$(VENV)/bin/bascule server --embedded-nats --raft-bootstrap-seed -d ./data --port 9292

# --durations: the slowest tests in every run's log, to keep the suite under 15 minutes on 2 cores.
test: venv bytecode check containers fuse faketime promtool
	$(PY) -m pytest -q --durations=15 $(if $(filter 0,$(CONTAINERS)),-m "not containers") $(PYTEST_ARGS)

# Lint, types and the layering contracts (pyproject.toml): the code's shape, checked before its behaviour.
check: venv
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# Only the nemesis test (tests/integration/test_nemesis.py), with many more faults: 300 unless
# BASCULE_NEMESIS_FAULTS says otherwise; BASCULE_NEMESIS_SEED=<seed> replays a run (its seed is printed
# at the start and in every failure). -s shows each fault as it happens.
BASCULE_NEMESIS_FAULTS ?= 300
soak: venv fuse
	BASCULE_NEMESIS_FAULTS=$(BASCULE_NEMESIS_FAULTS) $(if $(BASCULE_NEMESIS_SEED),BASCULE_NEMESIS_SEED=$(BASCULE_NEMESIS_SEED)) \
		$(PY) -m pytest -q -s tests/integration/test_nemesis.py $(PYTEST_ARGS)

# The simulator (src/bascule/simulation): SEEDS seeds of the real node code under seeded faults, on
# virtual time; each failure prints its seed, faults and trace, and SEEDS=<seed> replays it step for
# step (PYTHONHASHSEED is fixed so that a replay in another process takes the same steps). QUICK=1: short
# runs (3 nodes, 1-4 faults over 1-3 s). `make test` runs quick and full ones (tests/unit/test_simulation.py).
SEEDS ?= 1-1000
simulate: venv
	PYTHONHASHSEED=0 $(PY) -m bascule.simulation --seeds $(SEEDS) $(if $(FAULTS),--faults $(FAULTS)) $(if $(QUICK),--quick)

# podman as the Docker API, and bascule's images, for the `containers` tests: compose/podman-setup.sh
# (about 70 s on a bare machine, under 1 s when done, about 10 s after a source change). Where podman
# cannot be had (not installed, and no root with apt-get), the tests skip and say why.
containers: venv
ifneq ($(CONTAINERS),0)
	@if command -v podman >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }; then \
		PYTHON=$(PY) bash compose/podman-setup.sh >/dev/null; \
	else \
		echo "make containers: no podman, and no root with apt-get to install it: the containers tests will skip"; \
	fi
endif

# libfuse 3 for the power-cut disk (bascule.testing.powercut) that the power-cut and nemesis tests
# mount; without it (no root with apt-get) those tests skip and say why.
fuse:
	@command -v fusermount3 >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& { apt-get install -y -q fuse3 >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q fuse3 >/dev/null; }; }; } \
		|| echo "make fuse: no fusermount3, and no root with apt-get to install fuse3: the power-cut tests will skip"

# libfaketime (Debian's faketime) steps one node's wall clock in tests/integration/test_clock_steps.py;
# without it (no root with apt-get) that test skips and says why.
faketime:
	@ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& { apt-get install -y -q faketime >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q faketime >/dev/null; }; }; } \
		|| echo "make faketime: no libfaketime, and no root with apt-get to install faketime: the clock step test will skip"

# promtool (Debian's prometheus package) checks compose/alerts.yml and runs its unit tests, compose/alerts.test.yml,
# in tests/integration/test_alert_rules.py; without it (no root with apt-get) those tests skip and say why. Where
# systemd runs, the package also starts its Prometheus service (on :9090).
promtool:
	@command -v promtool >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& { apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; }; } \
		|| echo "make promtool: no promtool, and no root with apt-get to install prometheus: the alert rule tests will skip"

proto: venv
	$(PY) -m bascule.wire.generate

clean:
	rm -rf $(VENV) data
