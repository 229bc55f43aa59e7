/*-------------------------------------------------------------------------
 *
 * amr_reconcile.c
 *		Bring the DRAM tier back from the pool after any (re)start.
 *
 * Runs once per server lifetime (and again after every crash-restart, since
 * shared memory is then new), in the first process that uses amrtree, after
 * WAL recovery has finished.  It
 *
 *	1. resolves trees left BUILDING by a crash (committed creator: VALID;
 *	   otherwise the tree is dropped) and finishes interrupted drops;
 *	2. walks the Leaf Table once: a leaf survives if its tree is live, its
 *	   generation matches, and -- if it came from a split -- its origin's
 *	   version has moved past the split (otherwise the split never reached
 *	   its commit point and this half is discarded); unlogged trees are
 *	   emptied after a crash, as PostgreSQL empties unlogged relations;
 *	3. rebuilds the slot and leaf-id bitmaps from the surviving words;
 *	4. bulk-loads every tree's inner nodes from the Leaf Table boxes (STR),
 *	   without reading a single leaf.
 *
 * It is idempotent: an ERROR (e.g. DRAM too small) leaves the pool as it
 * was, and the next use retries from scratch.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "access/transam.h"
#include "miscadmin.h"
#include "storage/procarray.h"
#include "utils/memutils.h"

/* inner nodes of rebuilt trees are filled this far, leaving room to grow */
#define AMR_REBUILD_INNER_FILL ((AMR_INNER_FANOUT * 7) / 8)

static bool
creator_committed(TransactionId xid)
{
	if (!TransactionIdIsNormal(xid))
		return false;

	/*
	 * A BUILDING record older than the commit log can only be a tree whose
	 * creator finished long ago without this pool being used since; treat it
	 * as committed rather than dropping a tree that queries may need.
	 */
	if (TransactionIdPrecedes(xid, ShmemVariableCache->oldestClogXid))
		return true;
	if (TransactionIdIsInProgress(xid))
		return false;
	return TransactionIdDidCommit(xid);
}

static void
persist_state(AmrTreeRecord *rec, uint32 state)
{
	rec->state = state;
	amr_persist(&rec->state, sizeof(rec->state));
}

void
amr_reconcile(void)
{
	AmrStore   *s = &amr_store;
	uint32		cap = s->lt_capacity;
	uint32	   *per_tree;
	uint32	   *start;
	AmrPackItem *items;
	AmrPackItem *scratch;
	uint32	   *node_ids;
	uint8	   *keep;
	uint32		id;
	uint32		tn;
	uint32		dropped_leaves = 0;
	uint32		discarded_splits = 0;
	uint32		live_leaves = 0;
	MemoryContext cxt;
	MemoryContext old;

	cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree reconcile",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);

	/* start from nothing: this may be a retry after an ERROR */
	amr_bitmap_init(s->pmem_used, s->pmem_nslots);
	if (s->ssd_used)
		amr_bitmap_init(s->ssd_used, s->ssd_nslots);
	amr_bitmap_init(s->leaf_ids_used, cap);
	amr_bitmap_init(s->nodes_used, s->nnodes);
	amr_bitmap_init(amr_leaf_cache_used, amr_leaf_cache_n);
	for (id = 0; id < cap; id++)
		amr_leaf_volatile_reset(&s->leaves[id]);

	/* 1. tree records */
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &s->tree_records[tn];
		AmrTree    *t = &s->trees[tn];

		memset(t, 0, sizeof(*t));
		t->tree_no = tn;
		t->root = AMR_INVALID_NODE;
		t->null_root = AMR_INVALID_NODE;
		t->generation = rec->generation;
		t->budget_kind = rec->budget_kind;
		t->budget_value = rec->budget_value;
		t->tiering = !rec->tiering_off;

		if (rec->state == AMR_TREE_BUILDING)
		{
			if (creator_committed((TransactionId) rec->create_xid))
				persist_state(rec, AMR_TREE_VALID);
			else
				persist_state(rec, AMR_TREE_DROPPED);
		}
		else if (rec->state != AMR_TREE_FREE && rec->state != AMR_TREE_VALID &&
				 rec->state != AMR_TREE_DROPPED)
		{
			ereport(WARNING,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("amrtree: tree record %u has unknown state %u; dropping it",
							tn, rec->state)));
			persist_state(rec, AMR_TREE_DROPPED);
		}
	}

	/*
	 * 2. the Leaf Table.  Decide first, release afterwards: releasing bumps
	 * a version, which must not make a half-published split look complete.
	 */
	keep = palloc_extended(cap + 1, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	for (id = 0; id < cap; id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];
		uint64		word = amr_lt_word(s, id);
		AmrTreeRecord *rec;

		if ((id & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (AMR_WORD_TIER(word) == AMR_TIER_NONE)
			continue;
		keep[id] = 1;
		rec = e->tree_no < AMR_MAX_TREES ? &s->tree_records[e->tree_no] : NULL;
		if (rec == NULL || rec->state != AMR_TREE_VALID ||
			rec->generation != e->tree_generation)
			keep[id] = 0;
		else if ((rec->flags & AMR_TREE_FLAG_UNLOGGED) && amr_shared->unclean_start)
			keep[id] = 0;
		else if (e->split_origin != AMR_INVALID_LEAF &&
				 (e->split_origin >= cap ||
				  AMR_WORD_VERSION(amr_lt_word(s, e->split_origin)) <= e->split_origin_version))
		{
			keep[id] = 0;
			discarded_splits++;
		}
		else
		{
			uint32		tier = AMR_WORD_TIER(word);
			uint32		slot = AMR_WORD_SLOT(word);
			bool		ok;

			if (tier == AMR_TIER_PMEM)
				ok = slot < s->pmem_nslots && amr_bitmap_set(s->pmem_used, slot);
			else if (tier == AMR_TIER_SSD)
				ok = s->ssd_used != NULL && slot < s->ssd_nslots &&
					amr_bitmap_set(s->ssd_used, slot);
			else
				ok = false;
			if (!ok)
			{
				ereport(WARNING,
						(errcode(ERRCODE_DATA_CORRUPTED),
						 errmsg("amrtree: leaf %u refers to %s slot %u, which is out of range or already in use; dropping the leaf",
								id, tier == AMR_TIER_SSD ? "SSD" : "PMEM", slot)));
				keep[id] = 0;
			}
		}
	}
	per_tree = palloc0(sizeof(uint32) * (AMR_MAX_TREES * 2 + 1));
	for (id = 0; id < cap; id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];

		if (AMR_WORD_TIER(amr_lt_word(s, id)) == AMR_TIER_NONE)
			continue;
		if (!keep[id])
		{
			amr_lt_release(s, id);
			dropped_leaves++;
			continue;
		}
		amr_bitmap_set(s->leaf_ids_used, id);
		per_tree[e->tree_no * 2 + ((e->flags & AMR_LT_FLAG_NULLS) ? 1 : 0)]++;
		live_leaves++;
	}

	/* releases above moved the tier counters: recount from scratch below */
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		s->trees[tn].pmem_leaves = 0;
		s->trees[tn].ssd_leaves = 0;
	}

	/* finish drops: every leaf of a dropped tree was released above */
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
		if (s->tree_records[tn].state == AMR_TREE_DROPPED)
			persist_state(&s->tree_records[tn], AMR_TREE_FREE);

	/* 3. group leaves by (tree, side) with a counting sort */
	start = palloc0(sizeof(uint32) * (AMR_MAX_TREES * 2 + 1));
	for (tn = 1; tn <= AMR_MAX_TREES * 2; tn++)
		start[tn] = start[tn - 1] + per_tree[tn - 1];
	items = palloc_extended(sizeof(AmrPackItem) * ((Size) live_leaves + 1), MCXT_ALLOC_HUGE);
	scratch = palloc_extended(sizeof(AmrPackItem) * ((Size) live_leaves + 1), MCXT_ALLOC_HUGE);
	memcpy(per_tree, start, sizeof(uint32) * AMR_MAX_TREES * 2);
	for (id = 0; id < cap; id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];
		uint64		word = amr_lt_word(s, id);
		uint32		bucket;
		AmrLeaf    *leaf;

		if (AMR_WORD_TIER(word) == AMR_TIER_NONE)
			continue;
		bucket = e->tree_no * 2 + ((e->flags & AMR_LT_FLAG_NULLS) ? 1 : 0);
		items[per_tree[bucket]].box = amr_lt_mbr(s, id, word);
		items[per_tree[bucket]].ref = id;
		per_tree[bucket]++;

		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			leaf = amr_pmem_slot(s, AMR_WORD_SLOT(word));
			if (leaf->hdr.magic == AMR_LEAF_MAGIC && leaf->hdr.nentries <= AMR_LEAF_CAPACITY)
				s->trees[e->tree_no].nentries += amr_leaf_live_entries(leaf);
			s->trees[e->tree_no].pmem_leaves++;
		}
		else
		{
			/* SSD images are immutable: their count was recorded at publication */
			s->trees[e->tree_no].nentries += e->entries;
			s->trees[e->tree_no].ssd_leaves++;
		}
		s->trees[e->tree_no].nleaves++;
	}

	/* 4. inner nodes */
	node_ids = palloc_extended(sizeof(uint32) *
							   (amr_build_levels_nodes_needed(live_leaves, AMR_REBUILD_INNER_FILL) + 2),
							   MCXT_ALLOC_HUGE);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTree    *t = &s->trees[tn];
		int			side;

		if (s->tree_records[tn].state != AMR_TREE_VALID)
			continue;
		for (side = 0; side < 2; side++)
		{
			uint32		b = tn * 2 + side;
			uint32		n = start[b + 1] - start[b];
			AmrStatus	st;

			st = amr_build_levels(s, t, side == 1, items + start[b], n,
								  AMR_REBUILD_INNER_FILL, scratch, node_ids);
			if (st != AMR_OK)
				ereport(ERROR,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("amrtree DRAM area is too small to hold the inner nodes of every index"),
						 errdetail("%u inner nodes fit in amrtree.dram_size = %d kB; the pool holds %u leaves.",
								   s->nnodes, amr_dram_size_kb, live_leaves),
						 errhint("Raise amrtree.dram_size and restart the server.")));
		}
	}

	pg_atomic_fetch_add_u64(&amr_shared->rebuilds, 1);
	ereport(LOG,
			(errmsg("amrtree: rebuilt inner nodes from the Leaf Table: %u leaves live, %u released, %u half-published splits discarded",
					live_leaves, dropped_leaves, discarded_splits)));

	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}
