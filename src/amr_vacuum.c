/*-------------------------------------------------------------------------
 *
 * amr_vacuum.c
 *		ambulkdelete and amvacuumcleanup.
 *
 * VACUUM visits every leaf (following split right links, as scans do, so a
 * split racing with VACUUM cannot hide dead entries from it: a leaf is
 * changed only if its word is still the one read with its split links, see
 * vacuum_pmem_leaf) and rewrites
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
#include "amr_leafstore.h"

#include "access/xlog.h"
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
	*start_nsn = amr_sync_read(&t->nsn);
	amr_collect_leaves(&amr_store, t, false, NULL, 0, list, NULL, NULL, vacuum_realloc, NULL);
	amr_collect_leaves(&amr_store, t, true, NULL, 0, list, NULL, NULL, vacuum_realloc, NULL);
	LWLockRelease(amr_tree_lock(t));
}

/*
 * Rewrite a PMEM leaf without the entries VACUUM removes, under the leaf
 * lock (PMEM writes are memory copies).  Without a free PMEM slot, mark the
 * entries dead in place instead.  Returns the number removed, or
 * UINT64_MAX in *kept_out if the leaf's word is no longer "word" (the
 * caller looks again).
 *
 * The word must be the one read together with the leaf's split links: a
 * split in between switches the word and moves entries -- dead ones among
 * them -- to a right half that the caller learns about only by reading the
 * links again.  (Checking the tier alone, as this did until 2026-11-25,
 * let such a split hide dead entries: their TIDs were then reused by new
 * rows while the stale entries stayed, and scans returned rows outside
 * their windows.)  Appends and dead marks in place keep the word and move
 * nothing, so the current image is what counts.
 */
static uint64
vacuum_pmem_leaf(Relation index, AmrTree *t, uint32 leaf_id, uint64 word,
				 AmrLeaf *img, IndexBulkDeleteCallback callback,
				 void *callback_state, uint64 *kept_out)
{
	AmrStore   *s = &amr_store;
	AmrLeaf    *leaf;
	uint64		i;
	uint64		kept = 0;
	uint64		removed = 0;
	uint32		tier;
	uint32		slot;
	bool		have_slot;
	uint16		dead[AMR_LEAF_CAPACITY];

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	have_slot = !AMR_FAULT_ACTIVE("vacuum:pmem_full") &&
		amr_try_take_slot(AMR_SLOT_REPLACES_HERE, AMR_TIER_PMEM, &tier, &slot);
	/* shared: amrtree_check, which holds it exclusively, sees no half change */
	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
	if (amr_lt_word(s, leaf_id) != word)
	{
		/* split, rewritten or migrated since we looked: look again */
		LWLockRelease(amr_leaf_lock(leaf_id));
		LWLockRelease(amr_tree_lock(t));
		if (have_slot)
			amr_give_back_slot(tier, slot);
		LWLockRelease(&amr_shared->publish_lock);
		*kept_out = UINT64_MAX;
		return 0;
	}
	leaf = amr_leaf_pmem_image(index, t, leaf_id, &word);
	amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation,
						AMR_WORD_VERSION(word) + 1,
						(leaf->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0);
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
			dead[removed++] = (uint16) i;
	}
	if (removed > 0 && have_slot)
	{
		AmrFBox		mbr;

		img->hdr.nentries = kept;
		mbr = (img->hdr.flags & AMR_LEAF_FLAG_NULLS) ? amr_fbox_empty()
			: amr_leaf_image_mbr(img);
		AMR_FAULT_POINT("vacuum:before_image");
		amr_leaf_write_image(index, tier, slot, img);
		AMR_FAULT_POINT("vacuum:after_image_persisted");
		/* commit point */
		(void) amr_leaf_switch(index, t, leaf_id, tier, slot, &mbr, img, false,
							   AMR_LOG_REWRITE);
		AMR_FAULT_POINT("vacuum:after_switch");
	}
	else
	{
		if (have_slot)
			amr_give_back_slot(tier, slot);
		if (removed > 0)
		{
			AMR_FAULT_POINT("vacuum:before_mark_dead");
			amr_leaf_mark_dead_many(index, t, leaf_id, leaf, dead, (int) removed);
			AMR_FAULT_POINT("vacuum:after_mark_dead");
		}
	}
	if (removed > 0)
		amr_counter_sub(&t->nentries, removed);
	LWLockRelease(amr_leaf_lock(leaf_id));
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);
	*kept_out = kept;
	return removed;
}

/*
 * Rewrite an SSD leaf (whose image "snap" is immutable while its word is
 * "word"): write the survivors to a new slot with no lock held, then switch
 * if the word is unchanged.  Returns the number removed, or UINT64_MAX in
 * *kept_out if the leaf changed meanwhile (the caller looks again).
 */
static uint64
vacuum_ssd_leaf(Relation index, AmrTree *t, uint32 leaf_id, uint64 word,
				const AmrLeaf *snap, AmrLeaf *img,
				IndexBulkDeleteCallback callback, void *callback_state,
				uint64 *kept_out)
{
	AmrStore   *s = &amr_store;
	AmrFBox		mbr;
	uint64		i;
	uint64		removed = 0;
	uint32		tier;
	uint32		slot;
	bool		done = false;

	amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation,
						AMR_WORD_VERSION(word) + 1,
						(snap->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0);
	for (i = 0; i < snap->hdr.nentries; i++)
	{
		const AmrLeafEntry *en = &snap->entries[i];
		ItemPointerData tid;

		if (en->flags & AMR_ENTRY_FLAG_DEAD)
			continue;
		memcpy(&tid, &en->tid_blk_hi, sizeof(tid));
		if (!callback(&tid, callback_state))
			img->entries[img->hdr.nentries++] = *en;
		else
			removed++;
	}
	mbr = (img->hdr.flags & AMR_LEAF_FLAG_NULLS) ? amr_fbox_empty() : amr_leaf_image_mbr(img);

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	amr_take_slot(index, AMR_SLOT_REPLACES, AMR_TIER_SSD, &tier, &slot);
	PG_TRY();
	{
		AMR_FAULT_POINT("vacuum:before_image");
		amr_leaf_write_image(index, tier, slot, img);
		AMR_FAULT_POINT("vacuum:after_image_persisted");
		LWLockAcquire(amr_tree_lock(t), LW_SHARED);
		LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
		if (amr_lt_word(s, leaf_id) == word)
		{
			(void) amr_leaf_switch(index, t, leaf_id, tier, slot, &mbr, img, false,
								   AMR_LOG_REWRITE);
			AMR_FAULT_POINT("vacuum:after_switch");
			amr_counter_sub(&t->nentries, removed);
			done = true;
		}
		LWLockRelease(amr_leaf_lock(leaf_id));
		LWLockRelease(amr_tree_lock(t));
	}
	PG_CATCH();
	{
		amr_give_back_slot(tier, slot);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (!done)
		amr_give_back_slot(tier, slot);
	LWLockRelease(&amr_shared->publish_lock);
	*kept_out = done ? img->hdr.nentries : UINT64_MAX;
	return done ? removed : 0;
}

IndexBulkDeleteResult *
amrbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
			  IndexBulkDeleteCallback callback, void *callback_state)
{
	Relation	index = info->index;
	AmrTree    *t = amr_tree_open_for_write(index);
	AmrLeafList list = {NULL, 0, 0};
	uint64		start_nsn;
	uint32		pos;
	AmrLeaf    *snap = amr_alloc_leaf_buffer();
	AmrLeaf    *img = amr_alloc_leaf_buffer();
	double		kept_total = 0;
	uint32		visited = 0;

	if (stats == NULL)
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
	/* no tree (its pool is gone): nothing to remove until it is rebuilt */
	if (t == NULL)
		return stats;

	/*
	 * Removing an entry is durable in the pool at once, before its WAL
	 * record (MARK_DEAD) is flushed.  Flush the WAL
	 * first, so that it holds the commit of every transaction whose deletes
	 * VACUUM is about to act on (with synchronous_commit = off it may not
	 * yet), and the heap's own pruning: a crash can then not resurrect a
	 * row whose entry is gone.  See docs/design.md, "Removing entries".
	 */
	if (RelationNeedsWAL(index))
		XLogFlush(amr_insert_lsn());

	collect_all_leaves(t, &list, &start_nsn);
	for (pos = 0; pos < list.n; pos++)
	{
		uint32		leaf_id = list.ids[pos];
		uint32		pushed = AMR_INVALID_LEAF;

		for (;;)
		{
			uint64		word;
			uint64		nsn;
			uint32		rightlink;
			uint64		i;
			uint64		removed = 0;
			uint64		kept = 0;

			vacuum_delay_point();
			word = amr_leaf_read(index, t, leaf_id, snap, &nsn, &rightlink);
			if (word == 0)
				break;
			/* split since we collected the leaves: follow what moved */
			if (nsn > start_nsn && rightlink != AMR_INVALID_LEAF && rightlink != pushed)
			{
				pushed = rightlink;
				amr_leaf_list_push(&list, pushed, vacuum_realloc, NULL);
			}

			/* look first: most leaves need no rewrite */
			for (i = 0; i < snap->hdr.nentries; i++)
			{
				ItemPointerData tid;

				if (snap->entries[i].flags & AMR_ENTRY_FLAG_DEAD)
					continue;
				memcpy(&tid, &snap->entries[i].tid_blk_hi, sizeof(tid));
				if (callback(&tid, callback_state))
					removed++;
				else
					kept++;
			}
			if (removed > 0)
			{
				AMR_FAULT_POINT("vacuum:before_removal");
				if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
					removed = vacuum_pmem_leaf(index, t, leaf_id, word, img, callback,
											   callback_state, &kept);
				else
					removed = vacuum_ssd_leaf(index, t, leaf_id, word, snap, img,
											  callback, callback_state, &kept);
				if (kept == UINT64_MAX)
					continue;	/* the leaf moved or changed: look again */
				if (removed > 0 && amr_sync_read(&t->pinned) > 0)
					amr_wait_for_unpin(t, leaf_id);
			}
			visited++;
			stats->tuples_removed += removed;
			kept_total += kept;
			break;
		}
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

	t = amr_tree_open_for_write(info->index);
	if (t == NULL)
		return stats;
	if (stats == NULL)
	{
		/* no bulk delete ran: report what the tree holds */
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
		stats->num_index_tuples = (double) amr_counter_read(&t->nentries);
		stats->num_pages = (BlockNumber) amr_counter_read(&t->nleaves) + 1;
		stats->estimated_count = false;
	}
	return stats;
}
