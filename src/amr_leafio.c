/*-------------------------------------------------------------------------
 *
 * amr_leafio.c
 *		Leaf storage for the AM glue: allocation of leaf ids and slots,
 *		resolving a leaf id through the Leaf Table (paper Algorithm 1), the
 *		access hook that maintains hotness, and the pins that keep VACUUM
 *		from outrunning index-only scans.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <math.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "portability/instr_time.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/rel.h"

void
amr_report_status(AmrStatus st, Relation index)
{
	const char *name = index ? RelationGetRelationName(index) : "(none)";

	switch (st)
	{
		case AMR_OK:
			return;
		case AMR_ERR_DRAM_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("amrtree DRAM area is full (index \"%s\")", name),
					 errdetail("All %u inner nodes that fit in amrtree.dram_size = %d kB are in use.",
							   amr_store.nnodes, amr_dram_size_kb),
					 errhint("Raise amrtree.dram_size and restart the server.")));
			break;
		case AMR_ERR_PMEM_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_DISK_FULL),
					 errmsg("amrtree PMEM pool is full (index \"%s\")", name),
					 errdetail("All %u leaf slots of the pool are in use.",
							   amr_store.pmem_nslots),
					 errhint("Raise amrtree.pmem_size and restart the server; the pool is enlarged at startup.")));
			break;
		case AMR_ERR_SSD_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_DISK_FULL),
					 errmsg("amrtree SSD slot file is full (index \"%s\")", name)));
			break;
		case AMR_ERR_LEAF_IDS_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("amrtree Leaf Table is full (index \"%s\")", name),
					 errdetail("All %u leaf ids are in use.", amr_store.lt_capacity),
					 errhint("Raise amrtree.pmem_size and restart the server; the pool is enlarged at startup.")));
			break;
		case AMR_ERR_TOO_TALL:
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("amrtree index \"%s\" would exceed %d levels", name, AMR_MAX_HEIGHT)));
			break;
	}
}

uint32
amr_alloc_leaf_id(Relation index)
{
	int64		id = amr_bitmap_alloc(amr_store.leaf_ids_used);

	if (id < 0)
		amr_report_status(AMR_ERR_LEAF_IDS_FULL, index);
	return (uint32) id;
}

uint32
amr_alloc_pmem_slot(Relation index)
{
	int64		slot = amr_bitmap_alloc(amr_store.pmem_used);

	if (slot < 0)
		amr_report_status(AMR_ERR_PMEM_FULL, index);
	return (uint32) slot;
}

/*
 * Resolve a leaf id to its current image.  Caller holds the leaf lock (any
 * mode), which keeps the word and the image stable.  The image is checked
 * before anyone reads entries from it, so a damaged leaf raises an ERROR
 * instead of returning garbage.
 */
AmrLeaf *
amr_leaf_resolve(Relation index, AmrTree *t, uint32 leaf_id, uint64 *word_out)
{
	uint64		word = amr_lt_word(&amr_store, leaf_id);
	AmrLeaf    *leaf;

	*word_out = word;
	if (AMR_WORD_TIER(word) != AMR_TIER_PMEM ||
		AMR_WORD_SLOT(word) >= amr_store.pmem_nslots)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("leaf %u of amrtree index \"%s\" has an invalid Leaf Table word %016llx",
						leaf_id, RelationGetRelationName(index),
						(unsigned long long) word)));
	leaf = amr_pmem_slot(&amr_store, AMR_WORD_SLOT(word));
	if (leaf->hdr.magic != AMR_LEAF_MAGIC || leaf->hdr.leaf_id != leaf_id ||
		leaf->hdr.tree_no != t->tree_no ||
		leaf->hdr.nentries > AMR_LEAF_CAPACITY)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("leaf %u of amrtree index \"%s\" is damaged",
						leaf_id, RelationGetRelationName(index)),
				 errdetail("PMEM slot %u holds magic 0x%08x, leaf id %u, tree %u, %llu entries.",
						   AMR_WORD_SLOT(word), leaf->hdr.magic, leaf->hdr.leaf_id,
						   leaf->hdr.tree_no, (unsigned long long) leaf->hdr.nentries),
				 errhint("REINDEX the index.")));
	return leaf;
}

/*
 * Hotness, paper 3.5: h = h * exp(-lambda * dt) + 1.  Volatile, racy by
 * design (a lost update only blurs a heuristic; 8-byte aligned doubles are
 * never torn on the platforms we support).
 */
void
amr_leaf_access(uint32 leaf_id)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];
	instr_time	now;
	double		t;

	INSTR_TIME_SET_CURRENT(now);
	t = INSTR_TIME_GET_DOUBLE(now);
	v->hotness = v->hotness * exp(-0.1 * (t - v->last_access)) + 1.0;
	v->last_access = t;
	v->accesses++;
}

/* ---- pins ---- */

typedef struct LocalPin
{
	uint32		tree_no;
	uint32		leaf_id;
	SubTransactionId subid;
} LocalPin;

static LocalPin *local_pins = NULL;
static int	n_local_pins = 0;
static int	max_local_pins = 0;

void
amr_pin_leaf(AmrTree *t, uint32 leaf_id)
{
	if (n_local_pins == max_local_pins)
	{
		int			newmax = max_local_pins ? max_local_pins * 2 : 8;

		if (local_pins == NULL)
			local_pins = MemoryContextAlloc(TopMemoryContext, sizeof(LocalPin) * newmax);
		else
			local_pins = repalloc(local_pins, sizeof(LocalPin) * newmax);
		max_local_pins = newmax;
	}
	local_pins[n_local_pins].tree_no = t->tree_no;
	local_pins[n_local_pins].leaf_id = leaf_id;
	local_pins[n_local_pins].subid = GetCurrentSubTransactionId();
	n_local_pins++;
	__atomic_add_fetch(&amr_store.leaves[leaf_id].pins, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&t->pinned, 1, __ATOMIC_SEQ_CST);
}

static void
drop_pin(int i)
{
	LocalPin	p = local_pins[i];

	__atomic_sub_fetch(&amr_store.leaves[p.leaf_id].pins, 1, __ATOMIC_SEQ_CST);
	__atomic_sub_fetch(&amr_store.trees[p.tree_no].pinned, 1, __ATOMIC_SEQ_CST);
	local_pins[i] = local_pins[--n_local_pins];
}

void
amr_unpin_leaf(AmrTree *t, uint32 leaf_id)
{
	int			i;

	for (i = n_local_pins - 1; i >= 0; i--)
	{
		if (local_pins[i].tree_no == t->tree_no && local_pins[i].leaf_id == leaf_id)
		{
			drop_pin(i);
			return;
		}
	}
}

/* Release pins of aborted (sub)transactions; all of them at top level. */
void
amr_pins_release_all(SubTransactionId subid)
{
	int			i;

	if (amr_shared == NULL)
		return;
	for (i = n_local_pins - 1; i >= 0; i--)
		if (subid == InvalidSubTransactionId || local_pins[i].subid >= subid)
			drop_pin(i);
}

/*
 * Wait until no scan holds a pin on the leaf.  Called by VACUUM after it has
 * switched a leaf to an image without the dead entries: a scan that copied
 * the old image may still hand out one of those TIDs, and an index-only
 * scan would trust the visibility map for it once VACUUM has marked the heap
 * page all-visible.  Pins are held only while a scan returns one leaf's
 * matches, so the wait is short.
 */
void
amr_wait_for_unpin(AmrTree *t, uint32 leaf_id)
{
	while (__atomic_load_n(&amr_store.leaves[leaf_id].pins, __ATOMIC_SEQ_CST) > 0)
	{
		CHECK_FOR_INTERRUPTS();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
