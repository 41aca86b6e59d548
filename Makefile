# cropscale — set-up and common commands. `make fit` and `make test` are the two set-up commands.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of PyTorch (on this project's machines `pip install torch==2.13.0` takes the CPU wheel
# from local disk). On a GPU machine, install the CUDA build of your choice into .venv first:
# `make install` keeps any torch that is already there.
TORCH_SPEC ?= torch==2.13.0
SHARED_DATA ?= ../shared/data
SAMPLES := worldcereal-flanders pastis-r-mini vhr-samples
ARGS ?=

.PHONY: install data fit report ci test test-slow test-resilience test-elastic test-perf test-all lint tensorboard gpu-check gpu-carry gpu-rehearsal mutate bench study-cpu study-batch-cpu compare-cpu clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

data:
	@if [ -d "$(SHARED_DATA)/worldcereal-flanders" ]; then \
		mkdir -p data; \
		for s in $(SAMPLES); do [ -e "$(SHARED_DATA)/$$s" ] && ln -sfn "$$(cd $(SHARED_DATA)/$$s && pwd)" data/$$s; done; \
		echo "data/ links the bundled real samples in $(SHARED_DATA)"; ls -l data; \
	else \
		echo "The bundled sample is not at $(SHARED_DATA)/worldcereal-flanders (set SHARED_DATA=...)."; \
		echo "For PASTIS-HD: download PASTIS-HD (PASTIS + PASTIS-R + SPOT-6/7, Etalab licence 2.0) and run"; \
		echo "  python -m cropscale fit --config configs/pastis_hd.yaml --data.root=/path/to/PASTIS-HD"; \
		exit 1; \
	fi

fit: install data
	$(PY) -m cropscale fit $(ARGS)

# The quality-and-speed report of every run under runs/ (Markdown, CSV, PNG) into reports/.
report: install
	@test -d runs || { echo "make report: no runs/ folder here yet: run make fit first"; exit 2; }
	$(PY) -m cropscale report runs --output reports $(ARGS)

test: install data lint
	$(PY) -m pytest -q $(ARGS)

# What CI runs (.ci/run): lint + the default suite, then the slow stage, then the GPU check rehearsed on the CPU.
ci: test test-slow gpu-rehearsal

# The slow stage (-m slow: multi-process gloo runs, resilience, launchers with the torchrun elastic restart, matrix,
# studies). pytest's exit 5 ("no tests collected", e.g. ARGS naming a file with no slow test) is no failure of this stage.
test-slow: install data
	$(PY) -m pytest -q -m slow $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-slow: no slow test selected (pytest exit 5)"; exit 0; fi; exit $$rc

# kill/resume, SIGTERM, full disk, failed and hanging ranks, evaluation on 1-4 processes (slow; part of test-slow)
test-resilience: install data
	$(PY) -m pytest -q -m slow tests/integration/test_resilience.py tests/integration/test_hangs.py \
		tests/integration/test_eval_world_sizes_ddp.py $(ARGS)

# Only the torchrun elastic-restart test (slow; part of test-slow since it passed every run here: see docs/testing.md).
test-elastic: install data
	$(PY) -m pytest -q -s -m elastic tests/integration/test_launchers.py $(ARGS)

test-perf: install data
	$(PY) -m pytest -q -s -m perf $(ARGS)

test-all: install data
	$(PY) -m pytest -q -m "not gpu" $(ARGS)

lint: install
	$(PY) -m ruff check cropscale tests

# Prints the address that opens on loss, mIoU, step time and memory (pinned), then serves runs/.
# TensorBoard on runs/; its last line is the address to open (loss, best mIoU, step, memory pinned). TB_PORT=0: a free port
TB_PORT ?= 6006
tensorboard: install
	$(PY) -m cropscale tensorboard --logdir runs --port $(TB_PORT)

# The GPU check (scripts/gpu_check.sh): needs no install; on the lent H200 it runs from the carry.
GPU_CARRY ?= .gpu-carry
gpu-check:
	bash scripts/gpu_check.sh

# The carry for the lent H200 (cp312 wheels the image lacks, the source, the sample): under $(GPU_CARRY).
gpu-carry:
	bash scripts/gpu_carry.sh $(GPU_CARRY)

# The GPU check rehearsed on the CPU in a venv holding only the H200 image's packages (scripts/gpu_rehearsal.sh).
gpu-rehearsal: gpu-carry
	bash scripts/gpu_rehearsal.sh $(GPU_CARRY)

# Mutation testing (mutmut, scripts/mutate.py; not in CI): each module of MODULES is mutated in a copy under
# build/mutate/<module>/ and judged by the tests that reach it (the table MODULE_TESTS in scripts/mutate.py), one
# worker; results in build/mutate/results/<module>.tsv and .json. docs/mutation.md has the scores and how to compare.
MODULES ?=
mutate: install
	@test -n "$(MODULES)" || { echo 'make mutate: name the modules, e.g. make mutate MODULES="cropscale/numbers.py"'; exit 2; }
	OMP_NUM_THREADS=1 nice -n 10 $(PY) scripts/mutate.py $(MODULES) $(ARGS)

# Figures for the closing notes (CPU; each prints its evidence label; progress on stderr).
bench: install data
	@echo "make bench: [1/8] summary" >&2
	$(PY) -m cropscale summary
	@echo "make bench: [2/8] benchmark (bf16 is slow on a CPU without bfloat16 units)" >&2
	$(PY) -m cropscale benchmark --precision 32-true bf16-mixed --batch-sizes 1 4 --json reports/bench_cpu.json
	@echo "make bench: [3/8] lever-bench" >&2
	$(PY) -m cropscale lever-bench
	@echo "make bench: [4/8] loader-bench" >&2
	$(PY) -m cropscale loader-bench --workers 0 2 --model-steps 5
	@echo "make bench: [5/8] pipeline-bench" >&2
	$(PY) -m cropscale pipeline-bench --steps 10
	@echo "make bench: [6/8] tiling-bench" >&2
	$(PY) -m cropscale tiling-bench
	@echo "make bench: [7/8] callback-bench" >&2
	$(PY) -m cropscale callback-bench
	@echo "make bench: [8/8] callback-bench --model network" >&2
	$(PY) -m cropscale callback-bench --model network

study-cpu: install data
	$(PY) -m cropscale study --config configs/study/cpu.yaml $(ARGS)

# Batch sweep G = 4 ... 32 (AdamW and LAMB, square-root LR rule, 2 seeds): 16 short fits on 1 process.
study-batch-cpu: install data
	$(PY) -m cropscale study --config configs/study/batch_cpu.yaml $(ARGS)

# FP32 vs AMP BF16 (bf16-mixed), 2 seeds each, 3 short epochs of the bundled sample on 1 process (about 2-3 min
# on 2 cores): prints one verdict line per comparison (quality verdict at alpha 0.05 with its 90 % interval and
# margin, the convergence note, speed-up over runs, samples to target); the study table and the report land in
# runs/study/compare_cpu/.
compare-cpu: install data
	@mkdir -p runs/study
	OMP_NUM_THREADS=1 $(PY) -m cropscale study --config configs/study/compare_cpu.yaml $(ARGS) > runs/study/compare_cpu.log
	@echo "make compare-cpu: study table runs/study/compare_cpu/study_table.md, its output runs/study/compare_cpu.log"
	$(PY) -m cropscale report runs/study/compare_cpu/runs --output runs/study/compare_cpu/report --verdicts-only

clean:
	rm -rf runs reports lightning_logs .pytest_cache
