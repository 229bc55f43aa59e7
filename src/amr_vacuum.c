/*-------------------------------------------------------------------------
 *
 * amr_vacuum.c
 *		ambulkdelete and amvacuumcleanup.
 *
 * VACUUM visits every leaf (following split right links, as scans do, so a
 * split racing with VACUUM cannot hide dead entries from it: a leaf is
 * changed only if its word is still the one read with its split links, see
 * vacuum_pmem_leaf) and rewrites each leaf that holds dead entries out of
 * place: the surviving entries go to a fresh slot, which is persisted, and
 * switching the Leaf Table word is the commit point; the old slot is
 * returned only after the switch, under the leaf lock, so no reader can
 * still be reading it.  Then it waits for scans that copied the old image
 * and may still hand out its TIDs (see amr_wait_for_unpin) -- at every leaf
 * it visits, not only where it removed entries, as btree VACUUM takes a
 * cleanup lock on every leaf page: a scan may hold entries that a split
 * moved from the leaf it pinned to another leaf, where VACUUM removes them
 * (t/032 part (d)).  That suffices: an entry VACUUM removes predates it,
 * and moves only into new leaves (split halves), so if VACUUM visited the
 * scan's leaf before the scan copied the entry there, the entry was in it
 * and went then; otherwise VACUUM visits that leaf while, or after, the
 * scan pins it, and waits.
 *
 * When the pool has no free slot, dead entries are marked in place instead
 * (see below), so that VACUUM can always make room.
 *
 * SSD leaves cost device I/O, so they go in groups: VACUUM reads the SSD
 * leaves among the next ones in its list with one submission (read-ahead,
 * kept out of the SSD cache), and writes the new images of up to
 * VACUUM_SSD_BATCH leaves with one submission and one sync before it
 * switches any of them (flush_ssd_rewrites).
 *
 * Empty leaves are freed at the end of amrbulkdelete, as GiST deletes
 * empty leaf pages since version 13, when at least one leaf in
 * FREE_EMPTY_MIN_SHARE is empty and the index's AccessExclusiveLock can be
 * had at once.  The lock is what makes freeing safe: every scan and insert
 * holds a lock on the index for its whole transaction, so none is between
 * collecting a leaf id and reading it, and none can meet the id reused; the
 * tier manager, the one process that visits leaves without a relation lock,
 * is kept out by the tree's tier lock (the planner's estimate reads only
 * inner nodes, under the tree lock).  On a hot standby the lock's own WAL
 * record, which precedes ours, makes replay wait for (or cancel) the
 * standby's queries on the index, and holds new ones off until VACUUM's
 * transaction ends.  GiST instead waits until no snapshot could still reach
 * a deleted page; amrtree lets a freed id be reused at once, so it takes the
 * lock, as VACUUM does to truncate a table, and, like that truncation, gives
 * up rather than wait: the leaves stay empty until a later VACUUM.
 * docs/design.md, "Freeing empty leaves".
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"
#include "amr_wal.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "commands/vacuum.h"
#include "lib/qunique.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/wait_event.h"

/*
 * VACUUM frees the empty leaves it found once they are at least one leaf in
 * this many: each freeing packs the tree's inner nodes again (O(leaves)) and
 * briefly locks the index against everything, on standbys too, so it is
 * worth doing only for a share of the tree.
 */
#define FREE_EMPTY_MIN_SHARE	16

/* Tries at the index's AccessExclusiveLock, this many ms apart. */
#define FREE_LOCK_TRIES			10
#define FREE_LOCK_WAIT_MS		50


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
				 const AmrLeaf *snap, const bool *gone, AmrLeaf *img,
				 IndexBulkDeleteCallback callback, void *callback_state,
				 uint64 *kept_out)
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
		bool		is_gone;

		if (en->flags & AMR_ENTRY_FLAG_DEAD)
			continue;

		/*
		 * What the look found, where the position still holds the entry it
		 * looked at: appends add positions or reuse dead ones, and nothing
		 * else changes a live entry in place.  Asking the callback again for
		 * every entry was a third of an all-PMEM index's VACUUM.
		 */
		if (i < snap->hdr.nentries && !(snap->entries[i].flags & AMR_ENTRY_FLAG_DEAD) &&
			memcmp(&en->tid_blk_hi, &snap->entries[i].tid_blk_hi, sizeof(ItemPointerData)) == 0)
			is_gone = gone[i];
		else
		{
			ItemPointerData tid;

			memcpy(&tid, &en->tid_blk_hi, sizeof(tid));
			is_gone = callback(&tid, callback_state);
		}
		if (!is_gone)
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
 * SSD leaves are rewritten in batches of this many: their images are
 * written with one submission and made durable with one sync before any of
 * them is switched to.  One sync per leaf made VACUUM of an index whose
 * leaves are mostly on SSD an order of magnitude slower than GiST's (1 %
 * of a million rows deleted, 90 % of the leaves on SSD: 1.8 s against
 * 0.12 s).
 */
#define VACUUM_SSD_BATCH 64

/* An SSD leaf's image without its removed entries, not yet written. */
typedef struct PendingRewrite
{
	uint32		leaf_id;
	uint32		pushed;			/* the right link already queued for it */
	uint64		word;			/* the word whose image "img" was made from */
	uint64		removed;
	AmrLeaf    *img;
} PendingRewrite;

/* One amrbulkdelete: its leaves, its batch and its counts. */
typedef struct VacuumState
{
	Relation	index;
	AmrTree    *t;
	IndexBulkDeleteCallback callback;
	void	   *callback_state;
	AmrLeafList list;			/* leaves to visit, split halves appended */
	uint64		start_nsn;
	AmrLeaf    *snap;
	AmrLeaf    *img;
	AmrReadAhead ra;			/* SSD leaves of the list, read in groups */
	PendingRewrite pending[VACUUM_SSD_BATCH];
	int			npending;
	double		tuples_removed;
	double		kept_total;
	uint32		visited;
	AmrLeafList empty;			/* leaves left empty (split halves maybe
								 * twice) */
} VacuumState;

/*
 * The image of an SSD leaf ("snap", immutable while its word is "word")
 * without the entries marked in gone[], with the next version stamped.
 * Returns the number removed.
 */
static uint64
ssd_survivors(AmrTree *t, uint32 leaf_id, uint64 word, const AmrLeaf *snap,
			  const bool *gone, AmrLeaf *img)
{
	uint64		i;
	uint64		removed = 0;

	amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation,
						AMR_WORD_VERSION(word) + 1,
						(snap->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0);
	for (i = 0; i < snap->hdr.nentries; i++)
	{
		const AmrLeafEntry *en = &snap->entries[i];

		if (en->flags & AMR_ENTRY_FLAG_DEAD)
			continue;
		if (gone[i])
			removed++;
		else
			img->entries[img->hdr.nentries++] = *en;
	}
	return removed;
}

/*
 * Switch an SSD leaf to its durable new image in "slot" of "tier", if its
 * word is still "word" (the commit point).  Returns whether it switched;
 * the caller gives the slot back if not.  Caller holds the publish lock in
 * shared mode.
 */
static bool
ssd_switch(Relation index, AmrTree *t, uint32 leaf_id, uint64 word, uint32 tier,
		   uint32 slot, const AmrLeaf *img, uint64 removed)
{
	AmrFBox		mbr;
	bool		done = false;

	mbr = (img->hdr.flags & AMR_LEAF_FLAG_NULLS) ? amr_fbox_empty() : amr_leaf_image_mbr(img);
	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
	if (amr_lt_word(&amr_store, leaf_id) == word)
	{
		(void) amr_leaf_switch(index, t, leaf_id, tier, slot, &mbr, img, false,
							   AMR_LOG_REWRITE);
		AMR_FAULT_POINT("vacuum:after_switch");
		amr_counter_sub(&t->nentries, removed);
		done = true;
	}
	LWLockRelease(amr_leaf_lock(leaf_id));
	LWLockRelease(amr_tree_lock(t));
	return done;
}

/*
 * Rewrite one SSD leaf at once, with a sync of its own: write "img" (made
 * by ssd_survivors) to a new slot with no lock held, then switch if the
 * word is unchanged.  The slot may come from the reserve or the other tier,
 * so a full index can always be vacuumed.  Returns whether it switched.
 */
static bool
vacuum_ssd_leaf(Relation index, AmrTree *t, uint32 leaf_id, uint64 word,
				AmrLeaf *img, uint64 removed)
{
	uint32		tier;
	uint32		slot;
	bool		done;

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	amr_take_slot(index, AMR_SLOT_REPLACES, AMR_TIER_SSD, &tier, &slot);
	PG_TRY();
	{
		AMR_FAULT_POINT("vacuum:before_image");
		amr_leaf_write_image(index, tier, slot, img);
		AMR_FAULT_POINT("vacuum:after_image_persisted");
		done = ssd_switch(index, t, leaf_id, word, tier, slot, img, removed);
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
	return done;
}

static void vacuum_leaf(VacuumState *vs, uint32 leaf_id, uint32 pushed, bool may_defer);

/* Count a visited leaf, after waiting for the scans that pin it (see above). */
static void
leaf_done(VacuumState *vs, uint32 leaf_id, uint64 removed, uint64 kept)
{
	if (amr_sync_read(&vs->t->pinned) > 0)
		amr_wait_for_unpin(vs->t, leaf_id);
	vs->visited++;
	vs->tuples_removed += removed;
	vs->kept_total += kept;
	if (kept == 0)
		amr_leaf_list_push(&vs->empty, leaf_id, vacuum_realloc, NULL);
}

/*
 * Write the pending SSD rewrites with one submission and one sync, then
 * switch each leaf whose word is unchanged.  Slots come only from outside
 * the reserve and only from the SSD tier (AMR_SLOT_MIGRATES): a leaf that
 * gets none, or that changed meanwhile, is done again on its own
 * (vacuum_leaf without deferral), which may use the reserve -- by then the
 * batch's switches have given back their old slots.
 */
static void
flush_ssd_rewrites(VacuumState *vs)
{
	int			n = vs->npending;

	/* what PG_CATCH reads is volatile: set after the setjmp */
	volatile uint32 slots[VACUUM_SSD_BATCH];
	volatile bool has_slot[VACUUM_SSD_BATCH];
	bool		done[VACUUM_SSD_BATCH];
	int			i;

	if (n == 0)
		return;
	for (i = 0; i < n; i++)
	{
		has_slot[i] = false;
		done[i] = false;
	}
	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	PG_TRY();
	{
		uint32		wslots[VACUUM_SSD_BATCH];
		AmrLeaf    *imgs[VACUUM_SSD_BATCH];
		int			nwrites = 0;

		for (i = 0; i < n; i++)
		{
			uint32		tier;
			uint32		slot;

			if (!amr_try_take_slot(AMR_SLOT_MIGRATES, AMR_TIER_SSD, &tier, &slot))
				continue;
			slots[i] = slot;
			has_slot[i] = true;
			wslots[nwrites] = slot;
			imgs[nwrites++] = vs->pending[i].img;
		}
		if (nwrites > 0)
		{
			AMR_FAULT_POINT("vacuum:before_image");
			amr_leaf_write_ssd_batch(vs->index, wslots, imgs, nwrites);
			AMR_FAULT_POINT("vacuum:after_image_persisted");
		}
		for (i = 0; i < n; i++)
		{
			PendingRewrite *p = &vs->pending[i];

			if (!has_slot[i])
				continue;
			done[i] = ssd_switch(vs->index, vs->t, p->leaf_id, p->word, AMR_TIER_SSD,
								 slots[i], p->img, p->removed);
			if (done[i])
				has_slot[i] = false;	/* the leaf's now */
		}
	}
	PG_CATCH();
	{
		for (i = 0; i < n; i++)
			if (has_slot[i])
				amr_give_back_slot(AMR_TIER_SSD, slots[i]);
		PG_RE_THROW();
	}
	PG_END_TRY();
	for (i = 0; i < n; i++)
		if (has_slot[i])
			amr_give_back_slot(AMR_TIER_SSD, slots[i]);
	LWLockRelease(&amr_shared->publish_lock);

	vs->npending = 0;
	for (i = 0; i < n; i++)
	{
		PendingRewrite *p = &vs->pending[i];

		if (done[i])
			leaf_done(vs, p->leaf_id, p->removed, p->img->hdr.nentries);
		else
			vacuum_leaf(vs, p->leaf_id, p->pushed, false);
	}
}

/*
 * Visit one leaf: follow what a split since the start moved to its right,
 * and remove its entries whose rows VACUUM removes.  A PMEM leaf is
 * rewritten (or marked) at once; an SSD leaf's new image joins the batch
 * if may_defer, else it is written with a sync of its own.  "pushed" is the
 * right link already queued for this leaf.
 */
static void
vacuum_leaf(VacuumState *vs, uint32 leaf_id, uint32 pushed, bool may_defer)
{
	AmrTree    *t = vs->t;
	AmrLeaf    *snap = vs->snap;

	for (;;)
	{
		uint64		word;
		uint64		nsn;
		uint32		rightlink;
		uint64		i;
		uint64		removed = 0;
		uint64		kept = 0;
		bool		gone[AMR_LEAF_CAPACITY];

		vacuum_delay_point();
		word = amr_leaf_read_ahead(vs->index, t, leaf_id, snap, &nsn, &rightlink, &vs->ra);
		if (word == 0)
			return;
		/* split since we collected the leaves: follow what moved */
		if (nsn > vs->start_nsn && rightlink != AMR_INVALID_LEAF && rightlink != pushed)
		{
			pushed = rightlink;
			amr_leaf_list_push(&vs->list, pushed, vacuum_realloc, NULL);
		}

		/* look first: most leaves need no rewrite */
		for (i = 0; i < snap->hdr.nentries; i++)
		{
			ItemPointerData tid;

			gone[i] = false;
			if (snap->entries[i].flags & AMR_ENTRY_FLAG_DEAD)
				continue;
			memcpy(&tid, &snap->entries[i].tid_blk_hi, sizeof(tid));
			gone[i] = vs->callback(&tid, vs->callback_state);
			if (gone[i])
				removed++;
			else
				kept++;
		}
		if (removed == 0)
		{
			leaf_done(vs, leaf_id, 0, kept);
			return;
		}

		AMR_FAULT_POINT("vacuum:before_removal");
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			removed = vacuum_pmem_leaf(vs->index, t, leaf_id, word, snap, gone, vs->img,
									   vs->callback, vs->callback_state, &kept);
			if (kept == UINT64_MAX)
				continue;		/* the leaf moved or changed: look again */
		}
		else if (may_defer)
		{
			PendingRewrite *p = &vs->pending[vs->npending];

			if (p->img == NULL)
				p->img = amr_alloc_leaf_buffer();
			p->leaf_id = leaf_id;
			p->pushed = pushed;
			p->word = word;
			p->removed = ssd_survivors(t, leaf_id, word, snap, gone, p->img);
			if (++vs->npending == VACUUM_SSD_BATCH)
				flush_ssd_rewrites(vs);
			return;				/* counted when it is switched */
		}
		else
		{
			removed = ssd_survivors(t, leaf_id, word, snap, gone, vs->img);
			if (!vacuum_ssd_leaf(vs->index, t, leaf_id, word, vs->img, removed))
				continue;		/* the leaf changed: look again */
			kept = vs->img->hdr.nentries;
		}
		leaf_done(vs, leaf_id, removed, kept);
		return;
	}
}

static int
leaf_id_cmp(const void *a, const void *b)
{
	uint32		x = *(const uint32 *) a;
	uint32		y = *(const uint32 *) b;

	return (x > y) - (x < y);
}

/*
 * The tree's tier lock and the index's AccessExclusiveLock, both or
 * neither, trying a few times without waiting in a lock queue (see the file
 * header).  On a hot standby a waiting lock would hold up replay.
 */
static bool
lock_tree_alone(Relation index, AmrTree *t)
{
	int			attempt;

	for (attempt = 0;; attempt++)
	{
		if (amr_tier_trylock(t))
		{
			if (ConditionalLockRelation(index, AccessExclusiveLock))
				return true;
			amr_tier_unlock();
		}
		if (attempt == FREE_LOCK_TRIES - 1)
			return false;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 FREE_LOCK_WAIT_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Free those of the n leaves in ids (distinct) that are still empty, under
 * the locks of lock_tree_alone.  The record is flushed before the pool
 * changes, so a crash cannot leave a standby with leaves the primary no
 * longer has; the inner nodes are then packed from the Leaf Table, as at a
 * restart.  Returns how many were freed.
 */
static uint32
free_leaves(Relation index, AmrTree *t, const uint32 *ids, uint32 n)
{
	AmrStore   *s = &amr_store;
	xl_amr_freed_leaf *freed = palloc(sizeof(xl_amr_freed_leaf) * n);
	uint32		nfree = 0;
	uint32		i;

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	for (i = 0; i < n; i++)
	{
		uint32		id = ids[i];
		uint64		word;

		LWLockAcquire(amr_leaf_lock(id), LW_SHARED);
		word = amr_lt_word(s, id);
		if (amr_lt_owned_by(s, id, word, t->tree_no, t->generation) &&
			!(s->leaves[id].flags & AMR_LEAF_VOLATILE_SUSPECT) &&
			amr_leaf_current_entries(id, word) == 0)
		{
			/* the version, for crash recovery (see redo_free_leaves) */
			freed[nfree].leaf_id = id;
			freed[nfree].version = AMR_WORD_VERSION(word);
			nfree++;
		}
		LWLockRelease(amr_leaf_lock(id));
	}
	if (nfree > 0)
	{
		bool		logged = amr_wal_wanted(t, index);

		START_CRIT_SECTION();
		if (logged)
		{
			amr_wal_hold_checkpoint();
			XLogFlush(amr_wal_free_leaves(t, freed, nfree));
		}
		AMR_FAULT_POINT("vacuum:free_logged");
		amr_persist_batch_begin();
		for (i = 0; i < nfree; i++)
		{
			LWLockAcquire(amr_leaf_lock(freed[i].leaf_id), LW_EXCLUSIVE);
			amr_leaf_free(t, freed[i].leaf_id);
			LWLockRelease(amr_leaf_lock(freed[i].leaf_id));
		}
		amr_persist_batch_end();
		/* if the packing below fails, the tree's next use packs */
		t->inner_stale = 1;
		if (logged)
			amr_wal_release_checkpoint();
		END_CRIT_SECTION();
		AMR_FAULT_POINT("vacuum:leaves_freed");
		amr_tree_rebuild_inner(t);
	}
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);
	pfree(freed);
	return nfree;
}

/*
 * Free the empty leaves amrbulkdelete found, if they are a large enough
 * share of the tree and the index can be locked at once.  Adds them to the
 * statistics' deleted pages.  Done here and not in amvacuumcleanup, as GiST
 * does since version 13: a parallel VACUUM hands amvacuumcleanup a copy of
 * IndexBulkDeleteResult, so nothing of ours would reach it.
 */
static void
free_empty_leaves(IndexVacuumInfo *info, AmrTree *t, AmrLeafList *empty,
				  IndexBulkDeleteResult *stats)
{
	uint32		n;
	uint32		nfree;

	if (empty->n == 0 || !amr_free_empty_leaves(info->index))
		return;
	/* split halves visited again are in the list twice */
	qsort(empty->ids, empty->n, sizeof(uint32), leaf_id_cmp);
	n = (uint32) qunique(empty->ids, empty->n, sizeof(uint32), leaf_id_cmp);
	if ((uint64) n * FREE_EMPTY_MIN_SHARE < amr_counter_read(&t->nleaves))
		return;

	/*
	 * The lock's WAL record needs a transaction id, which a parallel VACUUM's
	 * leader cannot take: those leaves wait for the next VACUUM (autovacuum
	 * is never parallel).
	 */
	if (IsInParallelMode())
	{
		ereport(info->message_level,
				(errmsg("amrtree index \"%s\": %u empty leaves left for a VACUUM without parallel workers",
						RelationGetRelationName(info->index), n)));
		return;
	}
	AMR_FAULT_POINT("vacuum:before_free");
	if (!lock_tree_alone(info->index, t))
	{
		ereport(info->message_level,
				(errmsg("amrtree index \"%s\": %u empty leaves not freed: the index is in use",
						RelationGetRelationName(info->index), n)));
		return;
	}
	PG_TRY();
	{
		nfree = free_leaves(info->index, t, empty->ids, n);
	}
	PG_FINALLY();
	{
		amr_tier_unlock();
	}
	PG_END_TRY();

	/*
	 * Nothing else needs the lock: as VACUUM's truncation of a table, let the
	 * index's users go on at once.  A standby holds it until this transaction
	 * ends.
	 */
	UnlockRelation(info->index, AccessExclusiveLock);
	stats->pages_newly_deleted += nfree;
	stats->pages_deleted += nfree;
	stats->pages_free += nfree;
	ereport(info->message_level,
			(errmsg("amrtree index \"%s\": freed %u empty leaves",
					RelationGetRelationName(info->index), nfree)));
}

IndexBulkDeleteResult *
amrbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
			  IndexBulkDeleteCallback callback, void *callback_state)
{
	AmrTree    *t = amr_tree_open_for_write(info->index);
	VacuumState *vs;
	uint32		pos;
	uint64		pass;

	if (stats == NULL)
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
	/* no tree (its pool is gone): nothing to remove until it is rebuilt */
	if (t == NULL)
		return stats;

	vs = (VacuumState *) palloc0(sizeof(VacuumState));
	vs->index = info->index;
	vs->t = t;
	vs->callback = callback;
	vs->callback_state = callback_state;
	vs->snap = amr_alloc_leaf_buffer();
	vs->img = amr_alloc_leaf_buffer();
	amr_readahead_init(&vs->ra);

	/*
	 * Removing an entry is durable in the pool at once, before its WAL record
	 * (MARK_DEAD) is flushed.  Flush the WAL first, so that it holds the
	 * commit of every transaction whose deletes VACUUM is about to act on
	 * (with synchronous_commit = off it may not yet), and the heap's own
	 * pruning: a crash can then not resurrect a row whose entry is gone.  See
	 * docs/design.md, "Removing entries".
	 */
	if (RelationNeedsWAL(info->index))
		XLogFlush(amr_insert_lsn());

	/* ordered scans check for passes begun since they read a leaf */
	pass = amr_removal_pass_begin(t);
	PG_TRY();
	{
		collect_all_leaves(t, &vs->list, &vs->start_nsn);
		/* the list grows while we go (split halves, leaves done again) */
		for (pos = 0;; pos++)
		{
			if (pos == vs->list.n)
			{
				flush_ssd_rewrites(vs);
				if (pos == vs->list.n)
					break;
			}
			/* one device submission for the SSD leaves among the next ones */
			amr_readahead(&vs->ra, vs->index, &vs->list.ids[pos], vs->list.n - pos);
			vacuum_leaf(vs, vs->list.ids[pos], AMR_INVALID_LEAF, true);
		}
	}
	PG_FINALLY();
	{
		amr_removal_pass_end(t, pass);
	}
	PG_END_TRY();

	stats->tuples_removed += vs->tuples_removed;
	stats->num_index_tuples = vs->kept_total;
	stats->estimated_count = false;
	free_empty_leaves(info, t, &vs->empty, stats);
	/* as GiST's, the total counts what this VACUUM freed */
	stats->num_pages = (BlockNumber) amr_counter_read(&t->nleaves) + 1 + stats->pages_free;
	if (vs->list.ids)
		pfree(vs->list.ids);
	if (vs->empty.ids)
		pfree(vs->empty.ids);
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
