/*-------------------------------------------------------------------------
 *
 * amr_insert.c
 *		aminsert: append in place, or publish new images out of place.
 *
 * Fast path (most inserts): under the tree lock in shared mode, descend the
 * DRAM inner nodes, lock the chosen leaf exclusively and, if it is on PMEM
 * and has room, widen the boxes on the path (atomically, so concurrent
 * readers only ever see them grow) and append with the failure-atomic
 * append of amr_leaf.c.  The entry is durable when aminsert returns.
 *
 * Every other case writes new leaf images out of place: a full leaf splits,
 * an SSD leaf (whose images are immutable) is rewritten with the entry, an
 * empty side of the tree gets its first leaf.  Those run optimistically, so
 * that no lock is held during I/O:
 *
 *	1. look: choose the leaf and copy its image (amr_leaf_read);
 *	2. reserve a leaf id, slots on the tiers the budget allows, and the
 *	   inner nodes a split will consume;
 *	3. build the new images and make them durable (PMEM copy, or SSD write
 *	   and sync) with no tree or leaf lock held;
 *	4. lock, and check that the descent still chooses that leaf and that its
 *	   image is unchanged (the word, and for PMEM the bytes); then commit in
 *	   a critical section: switching the Leaf Table word is the commit point.
 *	   If anything changed, the images are discarded and we start over.
 *
 * Everything that can fail is reserved before the first persistent change,
 * so an error never leaves the DRAM tree and the Leaf Table disagreeing.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/predicate.h"
#include "storage/itemptr.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/*
 * SERIALIZABLE: report the write of an entry into a leaf whose path widened
 * the boxes of "nodes" (see amr_pred_leaf_block).  Called after the change
 * is made, so that a scan which read the leaf or a node before the change
 * has its predicate lock in place by then (scans lock before they read).
 */
static void
check_write_conflicts(Relation index, uint32 leaf_id, const uint32 *nodes, int nnodes)
{
	int			i;

	CheckForSerializableConflictIn(index, NULL, amr_pred_leaf_block(leaf_id));
	for (i = 0; i < nnodes; i++)
		CheckForSerializableConflictIn(index, NULL, amr_pred_node_block(nodes[i]));
}

/* Fast path; returns false if the tree side is empty or the leaf is not a
 * PMEM leaf with room. */
static bool
try_append(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
		   const AmrFBox *box)
{
	AmrStore   *s = &amr_store;
	AmrPath		path;
	uint32		leaf_id;
	bool		done = false;
	bool		serializable = IsolationIsSerializable();
	uint32		widened[AMR_MAX_HEIGHT];
	int			nwidened = 0;

	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	leaf_id = amr_choose_leaf(s, t, nulls, box, &path);
	if (leaf_id != AMR_INVALID_LEAF)
	{
		uint64		word;
		int			dead = -1;

		LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
		word = amr_lt_word(s, leaf_id);
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			AmrLeaf    *leaf = amr_leaf_pmem_image(index, t, leaf_id, &word);

			if (leaf->hdr.nentries < AMR_LEAF_CAPACITY ||
				(dead = amr_leaf_find_dead(leaf)) >= 0)
			{
				if (!nulls)
				{
					if (serializable)
						nwidened = amr_path_nodes_to_enlarge(s, &path, box, widened);
					amr_path_enlarge(s, &path, box);
				}
				amr_leaf_append(index, t, leaf_id, leaf, e, box, dead);
				amr_counter_add(&t->nentries, 1);
				done = true;
			}
		}
		LWLockRelease(amr_leaf_lock(leaf_id));
	}
	LWLockRelease(amr_tree_lock(t));
	if (done && serializable)
		check_write_conflicts(index, leaf_id, widened, nwidened);
	return done;
}

/*
 * Reserve what a first leaf, rewrite or split consumes (amr_reserve takes a
 * slot on the other tier when the wanted one is full), raising the error,
 * with its hint, when that is not possible.  Caller holds the publish lock
 * in shared mode.
 */
static void
reserve(Relation index, int need, uint32 tier_left, uint32 tier_right, bool left_adds,
		AmrReservation *r)
{
	amr_report_status(amr_reserve(&amr_store, need, tier_left, tier_right, left_adds, r), index);
}

/* Is the PMEM image of a leaf still what we copied? (leaf held) */
static bool
pmem_image_unchanged(const AmrLeaf *now, const AmrLeaf *snap)
{
	return now->hdr.nentries == snap->hdr.nentries &&
		memcmp(now->entries, snap->entries,
			   snap->hdr.nentries * sizeof(AmrLeafEntry)) == 0;
}

static bool
add_first_leaf(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
			   const AmrFBox *box, AmrLeaf *img)
{
	AmrStore   *s = &amr_store;
	AmrReservation r;
	AmrPath		path;
	bool		done = false;
	uint32		root = AMR_INVALID_NODE;
	uint32		leaf_id = AMR_INVALID_LEAF;

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	reserve(index, 0, amr_tree_new_image_tier(t, 1, 1), AMR_TIER_NONE, true, &r);
	PG_TRY();
	{
		amr_first_leaf_prepare(s, t, e, nulls, &r, img);
		AMR_FAULT_POINT("first_leaf:before_image");
		amr_leaf_write_image(index, r.tier_left, r.slot_left, img);
		AMR_FAULT_POINT("first_leaf:after_image_persisted");
		LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
		if (amr_choose_leaf(s, t, nulls, box, &path) == AMR_INVALID_LEAF)
		{
			/* the root node gets its first entry */
			root = nulls ? t->null_root : t->root;
			leaf_id = r.new_leaf;

			/*
			 * A scan of the empty side locked only the root.  The next insert
			 * there goes into this leaf without widening the root, and checks
			 * the leaf alone: give the leaf the root's locks, as a split
			 * gives the new half the old one's.
			 */
			PredicateLockPageSplit(index, amr_pred_node_block(root),
								   amr_pred_leaf_block(leaf_id));
			START_CRIT_SECTION();
			amr_leaf_first_commit(index, t, e, img, nulls, &r);
			amr_counter_add(&t->nentries, 1);
			END_CRIT_SECTION();
			done = true;
		}
		LWLockRelease(amr_tree_lock(t));
	}
	PG_CATCH();
	{
		amr_release_reservation(s, &r);
		PG_RE_THROW();
	}
	PG_END_TRY();
	amr_release_reservation(s, &r);
	LWLockRelease(&amr_shared->publish_lock);
	if (done)
		check_write_conflicts(index, leaf_id, &root, 1);
	return done;
}

/*
 * An SSD leaf with room: write a new image with the entry (and without dead
 * entries) and switch to it.  The new image goes to PMEM if the budget
 * allows (an update-heavy leaf belongs there, rule R3), else to SSD.
 */
static bool
rewrite_with_entry(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
				   const AmrFBox *box, uint32 leaf_id, uint64 word,
				   const AmrLeaf *snap, AmrLeaf *img)
{
	AmrStore   *s = &amr_store;
	AmrReservation r;
	AmrPath		path;
	AmrFBox		mbr;
	uint64		i;
	bool		done = false;
	uint32		widened[AMR_MAX_HEIGHT];
	int			nwidened = 0;

	amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation,
						AMR_WORD_VERSION(word) + 1, nulls);
	for (i = 0; i < snap->hdr.nentries; i++)
		if (!(snap->entries[i].flags & AMR_ENTRY_FLAG_DEAD))
			img->entries[img->hdr.nentries++] = snap->entries[i];
	img->entries[img->hdr.nentries++] = *e;
	mbr = nulls ? amr_fbox_empty() : amr_leaf_image_mbr(img);

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	reserve(index, 0, amr_tree_new_image_tier(t, 1, 0), AMR_TIER_NONE, false, &r);
	/* no leaf id is needed: give it back */
	amr_bitmap_clear(s->leaf_ids_used, r.new_leaf);
	r.new_leaf = AMR_INVALID_LEAF;
	PG_TRY();
	{
		AMR_FAULT_POINT("rewrite:before_image");
		amr_leaf_write_image(index, r.tier_left, r.slot_left, img);
		AMR_FAULT_POINT("rewrite:after_image_persisted");
		LWLockAcquire(amr_tree_lock(t), LW_SHARED);
		if (amr_choose_leaf(s, t, nulls, box, &path) == leaf_id)
		{
			LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
			if (amr_lt_word(s, leaf_id) == word)
			{
				uint64		old;

				if (!nulls)
				{
					nwidened = amr_path_nodes_to_enlarge(s, &path, box, widened);
					amr_path_enlarge(s, &path, box);
				}
				START_CRIT_SECTION();
				old = amr_leaf_switch(index, t, leaf_id, r.tier_left, r.slot_left, &mbr, img, true,
									  AMR_LOG_REWRITE);
				AMR_FAULT_POINT("rewrite:after_switch");
				r.slot_left = AMR_INVALID_SLOT;
				amr_counter_add(&t->nentries, 1);
				END_CRIT_SECTION();
				if (r.tier_left == AMR_TIER_PMEM && AMR_WORD_TIER(old) == AMR_TIER_SSD)
					amr_counter_add(&t->write_promotions, 1);
				done = true;
			}
			LWLockRelease(amr_leaf_lock(leaf_id));
		}
		LWLockRelease(amr_tree_lock(t));
	}
	PG_CATCH();
	{
		amr_release_reservation(s, &r);
		PG_RE_THROW();
	}
	PG_END_TRY();
	amr_release_reservation(s, &r);
	LWLockRelease(&amr_shared->publish_lock);
	if (done)
		check_write_conflicts(index, leaf_id, widened, nwidened);
	return done;
}

/*
 * SERIALIZABLE: after a split, with the tree still held exclusively (so no
 * insert can reach the new leaf or nodes first), give them the predicate
 * locks of what they were split from, as GiST does for pages; and return in
 * nodes[] the path's nodes the split changed: the leaf's parent, each node
 * that split and its parent, and those widened for the entry (a suffix of
 * the path all of them).
 */
static int
split_moves_locks(Relation index, const AmrPath *path, uint32 leaf_id, uint32 right_leaf,
				  const AmrNodeSplits *splits, int nwidened, uint32 *nodes)
{
	int			first = path->depth - 1 - splits->n;
	int			n = 0;
	int			d;
	int			i;

	PredicateLockPageSplit(index, amr_pred_leaf_block(leaf_id), amr_pred_leaf_block(right_leaf));
	for (i = 0; i < splits->n; i++)
		PredicateLockPageSplit(index, amr_pred_node_block(splits->from[i]),
							   amr_pred_node_block(splits->to[i]));
	first = Min(first, path->depth - nwidened);
	for (d = Max(first, 0); d < path->depth; d++)
		nodes[n++] = path->node[d];
	return n;
}

/* A full leaf: split it, optimistically.  *need carries the inner nodes
 * learnt to be needed from one attempt to the next. */
static bool
split_leaf(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
		   const AmrFBox *box, uint32 leaf_id, uint64 word, const AmrLeaf *snap,
		   int *need, AmrLeaf *left, AmrLeaf *right)
{
	AmrStore   *s = &amr_store;
	AmrReservation r;
	AmrPath		path;
	AmrFBox		lbox,
				rbox;
	uint32		tier_right = amr_tree_new_image_tier(t, 1, 1);
	uint32		tier_left;
	bool		done = false;
	uint32		changed[AMR_MAX_HEIGHT];
	int			nchanged = 0;

	/* a PMEM leaf keeps its tier; an SSD leaf comes to PMEM if there is room */
	if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		tier_left = AMR_TIER_PMEM;
	else
		tier_left = amr_tree_new_image_tier(t, tier_right == AMR_TIER_PMEM ? 2 : 1, 1);

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	reserve(index, *need, tier_left, tier_right, false, &r);
	PG_TRY();
	{
		amr_split_prepare(s, t, leaf_id, snap, word, e, nulls, &r, left, right,
						  &lbox, &rbox);
		AMR_FAULT_POINT("split:before_images");
		amr_leaf_write_image(index, r.tier_right, r.slot_right, right);
		AMR_FAULT_POINT("split:after_right_persisted");
		amr_leaf_write_image(index, r.tier_left, r.slot_left, left);
		AMR_FAULT_POINT("split:after_new_leaf_persisted");

		LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
		if (amr_choose_leaf(s, t, nulls, box, &path) == leaf_id)
		{
			int			needed = amr_path_nodes_needed(s, &path);

			if (needed > r.nnodes)
				*need = needed; /* inner nodes split too: reserve, retry */
			else
			{
				LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
				if (amr_lt_word(s, leaf_id) == word &&
					(AMR_WORD_TIER(word) != AMR_TIER_PMEM ||
					 pmem_image_unchanged(amr_pmem_slot(s, AMR_WORD_SLOT(word)), snap)))
				{
					uint32		widened[AMR_MAX_HEIGHT];
					int			nwidened = 0;

					if (!nulls)
					{
						nwidened = amr_path_nodes_to_enlarge(s, &path, box, widened);
						amr_path_enlarge(s, &path, box);
					}
					START_CRIT_SECTION();
					amr_leaf_split_commit(index, t, leaf_id, word, &path, nulls, &r, left, right,
										  &lbox, &rbox);
					amr_counter_add(&t->nentries, 1);
					END_CRIT_SECTION();
					nchanged = split_moves_locks(index, &path, leaf_id, right->hdr.leaf_id,
												 &r.splits, nwidened, changed);
					done = true;
				}
				LWLockRelease(amr_leaf_lock(leaf_id));
			}
		}
		LWLockRelease(amr_tree_lock(t));
	}
	PG_CATCH();
	{
		amr_release_reservation(s, &r);
		PG_RE_THROW();
	}
	PG_END_TRY();
	amr_release_reservation(s, &r);
	LWLockRelease(&amr_shared->publish_lock);
	if (done)
		check_write_conflicts(index, leaf_id, changed, nchanged);
	return done;
}

static void
insert_slow(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
			const AmrFBox *box)
{
	AmrStore   *s = &amr_store;
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree insert",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	AmrLeaf    *snap = amr_alloc_leaf_buffer();
	AmrLeaf    *left = amr_alloc_leaf_buffer();
	AmrLeaf    *right = amr_alloc_leaf_buffer();
	int			need = 0;

	for (;;)
	{
		AmrPath		path;
		uint32		leaf_id;
		uint64		word;

		CHECK_FOR_INTERRUPTS();
		LWLockAcquire(amr_tree_lock(t), LW_SHARED);
		leaf_id = amr_choose_leaf(s, t, nulls, box, &path);
		LWLockRelease(amr_tree_lock(t));

		if (leaf_id == AMR_INVALID_LEAF)
		{
			if (add_first_leaf(index, t, e, nulls, box, left))
				break;
			continue;
		}
		word = amr_leaf_read(index, t, leaf_id, snap, NULL, NULL);
		if (word == 0)
			continue;
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM &&
			(snap->hdr.nentries < AMR_LEAF_CAPACITY || amr_leaf_find_dead(snap) >= 0))
		{
			/* room appeared (someone split it): the fast path will do */
			if (try_append(index, t, e, nulls, box))
				break;
			continue;
		}
		if (AMR_WORD_TIER(word) == AMR_TIER_SSD &&
			amr_leaf_live_entries(snap) < AMR_LEAF_CAPACITY)
		{
			if (rewrite_with_entry(index, t, e, nulls, box, leaf_id, word, snap, left))
				break;
			continue;
		}
		if (split_leaf(index, t, e, nulls, box, leaf_id, word, snap, &need, left, right))
			break;
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}

void
amr_insert_entry(Relation index, AmrTree *t, const AmrLeafEntry *e)
{
	bool		nulls = (e->flags & AMR_ENTRY_FLAG_NULL) != 0;
	AmrFBox		box = amr_entry_fbox(e);

	if (!try_append(index, t, e, nulls, &box))
		insert_slow(index, t, e, nulls, &box);
}

bool
amrinsert(Relation index, Datum *values, bool *isnull, ItemPointer ht_ctid,
		  Relation heapRel, IndexUniqueCheck checkUnique, bool indexUnchanged,
		  struct IndexInfo *indexInfo)
{
	AmrTree    *t = amr_tree_open_for_write(index);
	AmrLeafEntry e;

	/* no tree (its pool is gone): the rebuild will read this row (amr_heal.c) */
	if (t == NULL)
		return false;
	memset(&e, 0, sizeof(e));
	if (isnull[0])
		e.flags = AMR_ENTRY_FLAG_NULL;
	else
	{
		AmrBox		key;

		amr_box_from_datum(index, values[0], &key);
		amr_entry_set_key(&e, &key);
	}
	StaticAssertStmt(sizeof(ItemPointerData) == 6, "ItemPointerData layout");
	memcpy(&e.tid_blk_hi, ht_ctid, sizeof(ItemPointerData));
	/* taken after the heap insert, so it lies at or beyond its WAL record */
	e.insert_lsn = amr_insert_lsn();

	amr_insert_entry(index, t, &e);
	return false;
}
