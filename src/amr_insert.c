/*-------------------------------------------------------------------------
 *
 * amr_insert.c
 *		aminsert: append to a leaf in place, or split it out of place.
 *
 * The common case runs under the tree lock in shared mode: descend the DRAM
 * inner nodes, lock the chosen leaf exclusively, widen the boxes on the path
 * (atomically, so concurrent readers only ever see them grow) and append the
 * entry with the failure-atomic append of amr_leaf.c.  The entry is durable
 * when aminsert returns (DESIGN 5).
 *
 * A full leaf is split under the tree lock in exclusive mode: both halves are
 * written to fresh slots, the new leaf is published in the Leaf Table with
 * "split from (leaf, version)", and switching the old leaf's word to its new
 * image is the commit point; recovery discards a new half whose origin never
 * switched.  Everything that can fail (leaf ids, slots, DRAM nodes) is
 * reserved before the first persistent change, and the publication runs in a
 * critical section, so an error can never leave the DRAM tree and the Leaf
 * Table disagreeing.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "miscadmin.h"
#include "storage/itemptr.h"
#include "utils/rel.h"

/* Fast path; returns false if the tree has no leaf or the leaf is full. */
static bool
try_append(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
		   const AmrFBox *box)
{
	AmrStore   *s = &amr_store;
	AmrPath		path;
	uint32		leaf_id;
	bool		done = false;

	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	leaf_id = amr_choose_leaf(s, t, nulls, box, &path);
	if (leaf_id != AMR_INVALID_LEAF)
	{
		AmrLeaf    *leaf;
		uint64		word;
		int			dead = -1;

		LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
		leaf = amr_leaf_resolve(index, t, leaf_id, &word);
		if (leaf->hdr.nentries < AMR_LEAF_CAPACITY ||
			(dead = amr_leaf_find_dead(leaf)) >= 0)
		{
			if (!nulls)
				amr_path_enlarge(s, &path, box);
			if (dead < 0)
				amr_leaf_append_pmem(s, leaf_id, leaf, e, box);
			else
				amr_leaf_reuse_dead_pmem(s, leaf_id, leaf, dead, e, box);
			s->leaves[leaf_id].updates++;
			__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
			done = true;
		}
		LWLockRelease(amr_leaf_lock(leaf_id));
	}
	LWLockRelease(amr_tree_lock(t));
	return done;
}

static void
insert_slow(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
			const AmrFBox *box)
{
	AmrStore   *s = &amr_store;
	AmrReservation r;
	PGAlignedBlock left;
	PGAlignedBlock right;

	int			need = 0;		/* inner nodes to reserve; learnt under the lock */

	for (;;)
	{
		AmrPath		path;
		uint32		leaf_id;
		bool		retry = false;
		AmrStatus	st;

		/*
		 * Reserve first, under the publish lock (amrtree_check waits out
		 * reservations not yet published).  An ERROR releases the LWLocks;
		 * the reservation is ours to undo.
		 */
		LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
		st = amr_reserve(s, need, &r);
		if (st != AMR_OK)
			amr_report_status(st, index);
		PG_TRY();
		{
			LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
			leaf_id = amr_choose_leaf(s, t, nulls, box, &path);
			if (leaf_id == AMR_INVALID_LEAF)
			{
				START_CRIT_SECTION();
				amr_publish_first_leaf(s, t, e, nulls, &r);
				__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
				END_CRIT_SECTION();
			}
			else
			{
				AmrLeaf    *leaf;
				uint64		word;

				LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
				leaf = amr_leaf_resolve(index, t, leaf_id, &word);
				if (!nulls)
					amr_path_enlarge(s, &path, box);
				/* someone else may have split it while we waited */
				if (leaf->hdr.nentries < AMR_LEAF_CAPACITY)
					amr_leaf_append_pmem(s, leaf_id, leaf, e, box);
				else if (amr_leaf_find_dead(leaf) >= 0)
					amr_leaf_reuse_dead_pmem(s, leaf_id, leaf,
											 amr_leaf_find_dead(leaf), e, box);
				else if (amr_path_nodes_needed(s, &path) > r.nnodes)
				{
					/* inner nodes will split too: reserve them and retry */
					need = amr_path_nodes_needed(s, &path);
					retry = true;
				}
				else
				{
					START_CRIT_SECTION();
					amr_publish_split(s, t, leaf_id, leaf, word, &path, e,
									  nulls, &r, (AmrLeaf *) left.data,
									  (AmrLeaf *) right.data);
					END_CRIT_SECTION();
				}
				if (!retry)
				{
					s->leaves[leaf_id].updates++;
					__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
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
		if (!retry)
			return;
	}
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
	AmrTree    *t = amr_tree_open(index);
	AmrLeafEntry e;

	memset(&e, 0, sizeof(e));
	if (isnull[0])
		e.flags = AMR_ENTRY_FLAG_NULL;
	else
		amr_box_from_datum(index, values[0], &e.key);
	StaticAssertStmt(sizeof(ItemPointerData) == 6, "ItemPointerData layout");
	memcpy(&e.tid_blk_hi, ht_ctid, sizeof(ItemPointerData));
	/* taken after the heap insert, so it lies at or beyond its WAL record */
	e.insert_lsn = amr_insert_lsn();

	amr_insert_entry(index, t, &e);
	return false;
}
