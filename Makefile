# amrtree: PGXS build.  See README.md for the two commands (demo, tests).

EXTENSION = amrtree amrtree_postgis
MODULE_big = amrtree
srcdir ?= .
# amrtree--0.1.sql, the first release's install script, ships so that the
# update path 0.1 -> 0.4 can be tested (t/026) as users take it.
DATA = sql/amrtree--0.4.sql sql/amrtree--0.1.sql sql/amrtree--0.1--0.2.sql sql/amrtree--0.2--0.3.sql \
	sql/amrtree--0.3--0.4.sql sql/amrtree_postgis--0.1.sql sql/amrtree_postgis--0.1--0.2.sql
PGFILEDESC = "amrtree - AMR-Tree index access method"

CORE_OBJS = \
	src/core/amr_bitmap.o \
	src/core/amr_check.o \
	src/core/amr_inner.o \
	src/core/amr_knn.o \
	src/core/amr_leaf.o \
	src/core/amr_ops.o \
	src/core/amr_pack.o \
	src/core/amr_persist.o \
	src/core/amr_policy.o \
	src/core/amr_ssd.o

OBJS = \
	$(CORE_OBJS) \
	src/amrtree.o \
	src/amr_build.o \
	src/amr_buildspill.o \
	src/amr_cost.o \
	src/amr_directory.o \
	src/amr_fault.o \
	src/amr_funcs.o \
	src/amr_geography.o \
	src/amr_heal.o \
	src/amr_writeback.o \
	src/amr_insert.o \
	src/amr_opclass.o \
	src/amr_leafstore.o \
	src/amr_lineage.o \
	src/amr_plan.o \
	src/amr_pool.o \
	src/amr_pins.o \
	src/amr_reconcile.o \
	src/amr_scan.o \
	src/amr_shmem.o \
	src/amr_slotfile.o \
	src/amr_ssdio.o \
	src/amr_ssdcache.o \
	src/amr_tier.o \
	src/amr_vacuum.o \
	src/amr_validate.o \
	src/amr_wal.o \
	src/amr_walredo.o

SHLIB_LINK += -lpmemobj -lpmem -luring -lm
PG_CPPFLAGS += -I$(srcdir)/src
# PostgreSQL's own flags plus -Wall -Wextra; the -Wno- flags silence
# warnings that PostgreSQL's headers themselves trigger under -Wextra.
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare \
	-Wno-missing-field-initializers -Wno-clobbered

# Tests.  scripts/test.sh is the one command (it builds, starts throwaway
# servers with amrtree preloaded, and runs everything); the usual PGXS
# targets work too, against a running server started with
# shared_preload_libraries = 'amrtree':
#   make installcheck          pg_regress and isolation tests
#   make prove_installcheck    TAP tests (they start servers of their own)
include $(srcdir)/test/schedule.mk
REGRESS = $(REGRESS_TESTS)
ISOLATION = $(ISOLATION_TESTS)
TAP_TESTS = 1

# rebuild objects when the headers they include change
override autodepend = yes

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The tree core's inner loops (choose-subtree over structure-of-arrays
# nodes, packing) are written to vectorise; GCC does that at -O3 (baseline
# SSE2, no CPU requirement beyond x86-64).
$(CORE_OBJS): override CFLAGS += -O3
