# `make demo` and `make test` each create .venv when missing and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench evidence evidence-full clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/statebudget trace gen --preset swe-team --seed 1 --hours 2 --out out/swe-team.jsonl
	$(BIN)/statebudget replay --cluster hetero16 --catalog agent-team --trace out/swe-team.jsonl --start warm --warmup 1800 \
	  --policy ondemand,lru-keepwarm,frequency,prefetch-all,static,llama-swap,sleep-swap,forecast-prewarm,ray-multiplex,statebudget,statebudget-lease \
	  --json out/report.json --plots out/plots

# The end-to-end service and chaos tests run after the rest, alone: their leases are quoted from
# this machine's measured tiers, and a simulator test on the other core slows the copies they time.
E2E := tests/test_e2e_service.py tests/test_chaos_service.py
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=5 $(addprefix --ignore ,$(E2E))
	$(BIN)/python -m pytest --durations=3 $(E2E)

# The seed documents' claims measured, in one page: out/evidence/index.html (quick: a smoke test of
# the argument in about 5 minutes; evidence-full: the fair ground, ten seeds, 2-hour traces).
evidence: $(STAMP)
	$(BIN)/statebudget evidence --quick --out out/evidence
evidence-full: $(STAMP)
	$(BIN)/statebudget evidence --out out/evidence-full

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_sim.py

clean:
	rm -rf $(VENV) out
