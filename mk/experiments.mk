# Reproducible studies in experiments/ (see experiments/README.md). Included from the Makefile;
# not part of `make test`. `make experiments` runs every study at its --quick size (about
# 10-15 minutes on a 2-core VM) and writes the CSV/PNG into $(EXPERIMENTS_OUT) so the committed,
# full-size results in experiments/<study>/ stay untouched; `make experiment-<study>
# EXPERIMENTS_OUT=` (empty) reruns one study at full size in place.
EXPERIMENTS := overhead memory_time memory_wall recompute_vs_store levels scaling vs_petsc energy_plan compression
EXPERIMENTS_OUT ?= build/experiments
EXPERIMENT_FLAGS ?= --quick
EXP_PY ?= .venv/bin/python

.PHONY: experiments $(addprefix experiment-,$(subst _,-,$(EXPERIMENTS)))

experiments: $(addprefix experiment-,$(subst _,-,$(EXPERIMENTS)))

define experiment_rule
experiment-$(subst _,-,$(1)): setup
	$(EXP_PY) experiments/$(1)/run.py $(EXPERIMENT_FLAGS) $(if $(EXPERIMENTS_OUT),--out $(EXPERIMENTS_OUT)/$(1))
endef
$(foreach e,$(EXPERIMENTS),$(eval $(call experiment_rule,$(e))))

# The soak study (issue 12): 20+ gradients at 10-32 MiB per rank, every level mix, async and sync,
# 1/2/3 ranks, then a kill -9 sweep of a 30-60 s run; about 15 minutes on a 2-core VM.
.PHONY: soak
soak: setup
	$(EXP_PY) experiments/soak/run.py $(if $(EXPERIMENTS_OUT),--out $(EXPERIMENTS_OUT)/soak)

# Compression (issue 18), part 2: auto with and without --compress at equal RAM budgets, wave 96^3 x 200
# steps on 2 ranks (experiments/compression/auto_budget.py; --quick: wave 32^3 x 40).
.PHONY: experiment-compression-auto
experiment-compression-auto: setup
	$(EXP_PY) experiments/compression/auto_budget.py $(EXPERIMENT_FLAGS) $(if $(EXPERIMENTS_OUT),--out $(EXPERIMENTS_OUT)/compression)
