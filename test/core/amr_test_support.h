/*
 * amr_test_support.h
 *		What the unit-test programs of the tree core share: the CHECK macro,
 *		a deterministic random generator, a store in plain memory standing in
 *		for the pool, and the loop that runs a table of tests and prints
 *		"ok <name>" / "FAIL <name>" and the closing line scripts/test.sh
 *		parses.
 *
 * Header-only (each program is one translation unit).  Before including,
 * a program defines T_SLOTS and T_NODES (the size of its store) and
 * RNG_SEED.
 */
#ifndef AMR_TEST_SUPPORT_H
#define AMR_TEST_SUPPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amr_persist.h"
#include "amr_tree.h"

#if !defined(T_SLOTS) || !defined(T_NODES) || !defined(RNG_SEED)
#error "define T_SLOTS, T_NODES and RNG_SEED before including amr_test_support.h"
#endif

#define TEST_UNUSED __attribute__((unused))

static int	failures = 0;
static char failmsg[512];

/* Fail the current test (return false) with a message unless cond holds. */
#define CHECK(cond, ...) \
	do { \
		if (!(cond)) { \
			snprintf(failmsg, sizeof(failmsg), __VA_ARGS__); \
			return false; \
		} \
	} while (0)

/* deterministic PRNG (splitmix64) */
static uint64_t rng_state = RNG_SEED;

static TEST_UNUSED uint64_t
rng_next(void)
{
	uint64_t	z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));

	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static TEST_UNUSED double
rnd(void)
{
	return (double) (rng_next() >> 11) / 9007199254740992.0;
}

/* ---- a store in plain memory ---- */

static AmrStore st;
static void *slot_mem;

static TEST_UNUSED void
store_init(void)
{
	size_t		bsz;

	memset(&st, 0, sizeof(st));
	slot_mem = aligned_alloc(AMR_SLOT_SIZE, (size_t) T_SLOTS * AMR_SLOT_SIZE);
	st.pmem_slots = slot_mem;
	st.pmem_nslots = T_SLOTS;
	st.lt = aligned_alloc(64, sizeof(AmrLeafTableEntry) * T_SLOTS);
	memset(st.lt, 0, sizeof(AmrLeafTableEntry) * T_SLOTS);
	st.lt_capacity = T_SLOTS;
	st.tree_records = calloc(AMR_MAX_TREES, sizeof(AmrTreeRecord));
	bsz = amr_bitmap_size(T_SLOTS);
	st.pmem_used = malloc(bsz);
	amr_bitmap_init(st.pmem_used, T_SLOTS);
	st.leaf_ids_used = malloc(bsz);
	amr_bitmap_init(st.leaf_ids_used, T_SLOTS);
	st.nodes_used = malloc(amr_bitmap_size(T_NODES));
	amr_bitmap_init(st.nodes_used, T_NODES);
	st.nodes = calloc(T_NODES, sizeof(AmrInnerNode));
	st.nnodes = T_NODES;
	st.leaves = calloc(T_SLOTS, sizeof(AmrLeafVolatile));
	st.trees = calloc(AMR_MAX_TREES, sizeof(AmrTree));
}

static TEST_UNUSED void
store_free(void)
{
	free(slot_mem);
	free(st.lt);
	free(st.tree_records);
	free(st.pmem_used);
	free(st.leaf_ids_used);
	free(st.nodes_used);
	free(st.nodes);
	free(st.leaves);
	free(st.trees);
}

/* An empty tree numbered no in the store. */
static TEST_UNUSED AmrTree *
new_tree(uint32_t no)
{
	AmrTree    *t = &st.trees[no];

	amr_tree_descriptor_init(t, no, NULL);
	t->generation = 1;
	if (amr_tree_init_empty(&st, t) != AMR_OK)
		abort();
	return t;
}

/* counts its calls, so that tests can see whether a rescan allocated */
static uint64_t realloc_calls = 0;

static TEST_UNUSED void *
test_realloc(void *p, size_t size, void *arg)
{
	(void) arg;
	realloc_calls++;
	return realloc(p, size);
}

/* ---- rows: a box (or NULL) and an id that travels in the TID fields ---- */

typedef struct Row
{
	AmrBox		b;
	bool		isnull;
	uint32_t	id;
} Row;

/* The leaf entry of a row. */
static TEST_UNUSED AmrLeafEntry
make_entry(const Row *r)
{
	AmrLeafEntry e;

	memset(&e, 0, sizeof(e));
	if (r->isnull)
		e.flags = AMR_ENTRY_FLAG_NULL;
	else
		e.key = r->b;
	e.tid_blk_hi = (uint16_t) (r->id >> 16);
	e.tid_blk_lo = (uint16_t) (r->id & 0xFFFF);
	e.tid_off = 1;
	e.insert_lsn = r->id;
	return e;
}

/* The id of the row an entry was made from. */
static TEST_UNUSED uint32_t
entry_row(const AmrLeafEntry *e)
{
	return ((uint32_t) e->tid_blk_hi << 16) | e->tid_blk_lo;
}

/* ---- running ---- */

typedef bool (*TestFn) (void);

typedef struct TestCase
{
	const char *name;
	TestFn		fn;
} TestCase;

/* Run every test, printing one line each and a closing line; exit status. */
static TEST_UNUSED int
run_tests(const TestCase *tests, size_t n, AmrPersistMode mode, const char *program)
{
	size_t		i;

	amr_persist_init(mode);
	for (i = 0; i < n; i++)
	{
		failmsg[0] = '\0';
		if (tests[i].fn())
			printf("ok %s\n", tests[i].name);
		else
		{
			printf("FAIL %s: %s\n", tests[i].name, failmsg);
			failures++;
		}
		fflush(stdout);
	}
	printf("ALL CORE TESTS RAN: %d failed (%s)\n", failures, program);
	return failures ? 1 : 0;
}

#endif							/* AMR_TEST_SUPPORT_H */
