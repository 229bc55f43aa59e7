/*-------------------------------------------------------------------------
 *
 * amr_vacuum.c
 *		ambulkdelete and amvacuumcleanup.
 *
 * VACUUM visits every leaf (following split right links, as scans do, so a
 * split racing with VACUUM cannot hide dead entries from it) and rewrites
 * each leaf that holds dead entries out of place: the surviving entries go
 * to a fresh slot, which is persisted, and switching the Leaf Table word is
 * the commit point; the old slot is returned only after the switch, under
 * the leaf lock, so no reader can still be reading it.  Then it waits for
 * scans that copied the old image and may still hand out its TIDs (see
 * amr_wait_for_unpin).
 *
 * When the pool has no free slot, dead entries are marked in place instead
 * (see below), so that VACUUM can always make room.
 *
 * Empty leaves are kept, like GiST before version 13: their inner entries
 * keep a box that still attracts inserts in that region.  REINDEX reclaims
 * the space.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "commands/vacuum.h"
#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/rel.h"

static void *
vacuum_realloc(void *ptr, size_t size, void *arg)
{
	if (ptr == NULL)
		return MemoryContextAllocHuge(CurrentMemoryContext, size);
	return repalloc_huge(ptr, size);
}

static void
collect_all_leaves(AmrTree *t, AmrLeafList *list, uint64 *start_nsn)
{
	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	*start_nsn = __atomic_load_n(&t->nsn, __ATOMIC_SEQ_CST);
	amr_collect_leaves(&amr_store, t, false, NULL, 0, list, vacuum_realloc, NULL);
	amr_collect_leaves(&amr_store, t, true, NULL, 0, list, vacuum_realloc, NULL);
	LWLockRelease(amr_tree_lock(t));
}

IndexBulkDeleteResult *
amrbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
			  IndexBulkDeleteCallback callback, void *callback_state)
{
	Relation	index = info->index;
	AmrTree    *t = amr_tree_open(index);
	AmrStore   *s = &amr_store;
	AmrLeafList list = {NULL, 0, 0};
	uint64		start_nsn;
	uint32		pos;
	PGAlignedBlock buf;
	AmrLeaf    *img = (AmrLeaf *) buf.data;
	double		kept_total = 0;
	uint32		visited = 0;

	if (stats == NULL)
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));

	collect_all_leaves(t, &list, &start_nsn);
	for (pos = 0; pos < list.n; pos++)
	{
		uint32		leaf_id = list.ids[pos];
		AmrLeafTableEntry *e = &s->lt[leaf_id];
		AmrLeafVolatile *v = &s->leaves[leaf_id];
		AmrLeaf    *leaf;
		uint64		word;
		uint32		slot;
		uint64		i;
		uint64		n;
		uint64		kept = 0;
		uint64		removed = 0;
		uint32		pushed = AMR_INVALID_LEAF;
		int64		free_slot;

		vacuum_delay_point();

		/* look first, under a shared lock: most leaves need no rewrite */
		LWLockAcquire(amr_leaf_lock(leaf_id), LW_SHARED);
		word = amr_lt_word(s, leaf_id);
		if (AMR_WORD_TIER(word) == AMR_TIER_NONE ||
			e->tree_no != t->tree_no || e->tree_generation != t->generation)
		{
			LWLockRelease(amr_leaf_lock(leaf_id));
			continue;
		}
		if (v->nsn > start_nsn && v->rightlink != AMR_INVALID_LEAF)
		{
			pushed = v->rightlink;
			amr_leaf_list_push(&list, pushed, vacuum_realloc, NULL);
		}
		visited++;
		leaf = amr_leaf_resolve(index, t, leaf_id, &word);
		n = leaf->hdr.nentries;
		memcpy(img->entries, leaf->entries, n * sizeof(AmrLeafEntry));
		LWLockRelease(amr_leaf_lock(leaf_id));

		for (i = 0; i < n; i++)
		{
			ItemPointerData tid;

			if (img->entries[i].flags & AMR_ENTRY_FLAG_DEAD)
				continue;
			memcpy(&tid, &img->entries[i].tid_blk_hi, sizeof(tid));
			if (callback(&tid, callback_state))
				removed++;
			else
				kept++;
		}
		if (removed == 0)
		{
			kept_total += kept;
			continue;
		}

		/*
		 * Rewrite out of place from the current image (it may have grown).
		 * With no free slot (a full pool), mark the dead entries in place
		 * instead: one persisted 2-byte store each, and inserts reuse the
		 * positions; a later rewrite or split compacts them away.
		 */
		LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
		free_slot = amr_bitmap_alloc(s->pmem_used);
		LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
		/* it may have split since we looked: follow what moved */
		if (v->nsn > start_nsn && v->rightlink != AMR_INVALID_LEAF &&
			v->rightlink != pushed)
			amr_leaf_list_push(&list, v->rightlink, vacuum_realloc, NULL);
		leaf = amr_leaf_resolve(index, t, leaf_id, &word);
		amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation,
							AMR_WORD_VERSION(word) + 1,
							(leaf->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0);
		kept = 0;
		removed = 0;
		for (i = 0; i < leaf->hdr.nentries; i++)
		{
			const AmrLeafEntry *en = &leaf->entries[i];
			ItemPointerData tid;

			if (en->flags & AMR_ENTRY_FLAG_DEAD)
				continue;
			memcpy(&tid, &en->tid_blk_hi, sizeof(tid));
			if (!callback(&tid, callback_state))
				img->entries[kept++] = *en;
			else
			{
				removed++;
				if (free_slot < 0)
					amr_leaf_mark_dead_pmem(leaf, (int) i);
			}
		}
		if (removed > 0 && free_slot >= 0)
		{
			AmrFBox		mbr;
			uint64		old_word;

			slot = (uint32) free_slot;
			img->hdr.nentries = kept;
			mbr = (img->hdr.flags & AMR_LEAF_FLAG_NULLS) ? amr_fbox_empty()
				: amr_leaf_image_mbr(img);
			amr_memcpy_persist(amr_pmem_slot(s, slot), img,
							   offsetof(AmrLeaf, entries) + kept * sizeof(AmrLeafEntry));
			/* commit point */
			old_word = amr_lt_switch(s, leaf_id, AMR_TIER_PMEM, slot, &mbr);
			amr_free_word_slot(&amr_store, old_word);
		}
		else if (free_slot >= 0)
			amr_bitmap_clear(s->pmem_used, (uint64) free_slot);
		if (removed > 0)
		{
			v->updates++;
			__atomic_sub_fetch(&t->nentries, removed, __ATOMIC_RELAXED);
		}
		LWLockRelease(amr_leaf_lock(leaf_id));
		LWLockRelease(&amr_shared->publish_lock);

		if (removed > 0 && __atomic_load_n(&t->pinned, __ATOMIC_SEQ_CST) > 0)
			amr_wait_for_unpin(t, leaf_id);

		stats->tuples_removed += removed;
		kept_total += kept;
	}

	stats->num_index_tuples = kept_total;
	stats->num_pages = visited + 1;
	stats->estimated_count = false;
	if (list.ids)
		pfree(list.ids);
	return stats;
}

IndexBulkDeleteResult *
amrvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats)
{
	AmrTree    *t;

	if (info->analyze_only)
		return stats;

	t = amr_tree_open(info->index);
	if (stats == NULL)
	{
		/* no bulk delete ran: report what the tree holds */
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
		stats->num_index_tuples = (double) __atomic_load_n(&t->nentries, __ATOMIC_RELAXED);
		stats->num_pages = (BlockNumber) __atomic_load_n(&t->nleaves, __ATOMIC_RELAXED) + 1;
		stats->estimated_count = false;
	}
	return stats;
}
