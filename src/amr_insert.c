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

/* Resources reserved before the exclusive part of a split. */
typedef struct SplitReservation
{
	uint32		new_leaf;
	uint32		slot_left;
	uint32		slot_right;
	int			nnodes;
	uint32		nodes[AMR_MAX_HEIGHT + 1];
} SplitReservation;

static void
reserve_for_split(Relation index, AmrTree *t, SplitReservation *r)
{
	AmrStore   *s = &amr_store;
	int			i;

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = r->slot_right = UINT32_MAX;
	r->nnodes = 0;
	for (i = 0; i <= AMR_MAX_HEIGHT; i++)
		r->nodes[i] = AMR_INVALID_NODE;

	PG_TRY();
	{
		int			need = amr_split_nodes_needed(t);

		r->new_leaf = amr_alloc_leaf_id(index);
		r->slot_left = amr_alloc_pmem_slot(index);
		r->slot_right = amr_alloc_pmem_slot(index);
		if (need > AMR_MAX_HEIGHT)
			amr_report_status(AMR_ERR_TOO_TALL, index);
		for (i = 0; i < need; i++)
		{
			if (amr_node_alloc(s, &r->nodes[i], 1) != AMR_OK)
				amr_report_status(AMR_ERR_DRAM_FULL, index);
			r->nnodes++;
		}
	}
	PG_CATCH();
	{
		if (r->new_leaf != AMR_INVALID_LEAF)
			amr_bitmap_clear(s->leaf_ids_used, r->new_leaf);
		if (r->slot_left != UINT32_MAX)
			amr_bitmap_clear(s->pmem_used, r->slot_left);
		if (r->slot_right != UINT32_MAX)
			amr_bitmap_clear(s->pmem_used, r->slot_right);
		for (i = 0; i <= AMR_MAX_HEIGHT; i++)
			if (r->nodes[i] != AMR_INVALID_NODE)
				amr_node_free(s, r->nodes[i]);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

static void
release_reservation(SplitReservation *r)
{
	AmrStore   *s = &amr_store;
	int			i;

	if (r->new_leaf != AMR_INVALID_LEAF)
		amr_bitmap_clear(s->leaf_ids_used, r->new_leaf);
	if (r->slot_left != UINT32_MAX)
		amr_bitmap_clear(s->pmem_used, r->slot_left);
	if (r->slot_right != UINT32_MAX)
		amr_bitmap_clear(s->pmem_used, r->slot_right);
	for (i = 0; i <= AMR_MAX_HEIGHT; i++)
		if (r->nodes[i] != AMR_INVALID_NODE)
			amr_node_free(s, r->nodes[i]);
}

static inline AmrFBox
entry_box(const AmrLeafEntry *e)
{
	if (e->flags & AMR_ENTRY_FLAG_NULL)
	{
		AmrFBox		zero = {0, 0, 0, 0};

		return zero;
	}
	return amr_fbox_from_box(&e->key);
}

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

		LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
		leaf = amr_leaf_resolve(index, t, leaf_id, &word);
		if (leaf->hdr.nentries < AMR_LEAF_CAPACITY)
		{
			if (!nulls)
				amr_path_enlarge(s, &path, box);
			amr_leaf_append_pmem(s, leaf_id, leaf, e, box);
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
write_first_leaf(AmrTree *t, const AmrLeafEntry *e, bool nulls,
				 const AmrFBox *box, SplitReservation *r)
{
	AmrStore   *s = &amr_store;
	uint32		leaf_id = r->new_leaf;
	uint32		version = AMR_WORD_VERSION(amr_lt_word(s, leaf_id)) + 1;
	AmrLeaf    *img = amr_pmem_slot(s, r->slot_left);
	AmrFBox		mbr = nulls ? amr_fbox_empty() : *box;

	amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation, version, nulls);
	img->entries[0] = *e;
	img->hdr.nentries = 1;
	amr_persist(img, offsetof(AmrLeaf, entries) + sizeof(AmrLeafEntry));

	START_CRIT_SECTION();
	amr_lt_publish_new(s, leaf_id, t->tree_no, t->generation,
					   nulls ? AMR_LT_FLAG_NULLS : 0, AMR_INVALID_LEAF, 0,
					   AMR_TIER_PMEM, r->slot_left, &mbr);
	memset(&s->leaves[leaf_id], 0, sizeof(AmrLeafVolatile));
	s->leaves[leaf_id].rightlink = AMR_INVALID_LEAF;
	amr_add_first_leaf(s, t, nulls, leaf_id, nulls ? box : &mbr);
	__atomic_add_fetch(&t->nleaves, 1, __ATOMIC_RELAXED);
	END_CRIT_SECTION();

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = UINT32_MAX;
}

static void
split_leaf(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *full,
		   uint64 word, const AmrPath *path, const AmrLeafEntry *e,
		   bool nulls, SplitReservation *r)
{
	AmrStore   *s = &amr_store;
	PGAlignedBlock left_buf;
	PGAlignedBlock right_buf;
	AmrLeaf    *left = (AmrLeaf *) left_buf.data;
	AmrLeaf    *right = (AmrLeaf *) right_buf.data;
	uint32		old_version = AMR_WORD_VERSION(word);
	uint32		right_version = AMR_WORD_VERSION(amr_lt_word(s, r->new_leaf)) + 1;
	AmrFBox		left_box,
				right_box;
	AmrLeafVolatile *lv = &s->leaves[leaf_id];
	AmrLeafVolatile *rv = &s->leaves[r->new_leaf];
	uint64		old_word;
	uint32		lflags = nulls ? AMR_LT_FLAG_NULLS : 0;

	amr_leaf_image_init(left, leaf_id, t->tree_no, t->generation, old_version + 1, nulls);
	amr_leaf_image_init(right, r->new_leaf, t->tree_no, t->generation, right_version, nulls);
	amr_leaf_split_images(full, e, left, right);
	if (nulls)
	{
		left_box = right_box = amr_fbox_empty();
	}
	else
	{
		left_box = amr_leaf_image_mbr(left);
		right_box = amr_leaf_image_mbr(right);
	}

	/* data first: both images durable before anything points at them */
	amr_memcpy_nodrain(amr_pmem_slot(s, r->slot_right), right,
					   offsetof(AmrLeaf, entries) + right->hdr.nentries * sizeof(AmrLeafEntry));
	amr_memcpy_nodrain(amr_pmem_slot(s, r->slot_left), left,
					   offsetof(AmrLeaf, entries) + left->hdr.nentries * sizeof(AmrLeafEntry));
	amr_drain();

	START_CRIT_SECTION();
	amr_lt_publish_new(s, r->new_leaf, t->tree_no, t->generation, lflags,
					   leaf_id, old_version, AMR_TIER_PMEM, r->slot_right, &right_box);
	/* commit point */
	old_word = amr_lt_switch(s, leaf_id, AMR_TIER_PMEM, r->slot_left, &left_box);
	amr_free_slot(old_word);

	/* GiST-style links so scans that started before the split find moved
	 * entries: the right half inherits the old NSN and right link */
	memset(rv, 0, sizeof(*rv));
	rv->nsn = lv->nsn;
	rv->rightlink = lv->rightlink;
	rv->hotness = lv->hotness;
	rv->last_access = lv->last_access;
	lv->nsn = __atomic_add_fetch(&t->nsn, 1, __ATOMIC_SEQ_CST);
	lv->rightlink = r->new_leaf;
	lv->smo_count++;
	rv->smo_count = lv->smo_count;

	amr_apply_leaf_split(s, t, nulls, path,
						 nulls ? &(AmrFBox) {0, 0, 0, 0} : &left_box,
						 r->new_leaf,
						 nulls ? &(AmrFBox) {0, 0, 0, 0} : &right_box,
						 r->nodes);
	__atomic_add_fetch(&t->nleaves, 1, __ATOMIC_RELAXED);
	END_CRIT_SECTION();

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = r->slot_right = UINT32_MAX;
}

static void
insert_slow(Relation index, AmrTree *t, const AmrLeafEntry *e, bool nulls,
			const AmrFBox *box)
{
	AmrStore   *s = &amr_store;
	SplitReservation r;

	for (;;)
	{
		AmrPath		path;
		uint32		leaf_id;
		bool		retry = false;

		/* an ERROR releases the LWLocks; the reservation is ours to undo */
		LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
		reserve_for_split(index, t, &r);
		PG_TRY();
		{
			LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
			if (r.nnodes < amr_split_nodes_needed(t))
				retry = true;	/* the tree grew meanwhile */
			else
			{
				leaf_id = amr_choose_leaf(s, t, nulls, box, &path);
				if (leaf_id == AMR_INVALID_LEAF)
				{
					write_first_leaf(t, e, nulls, box, &r);
					__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
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
					else
						split_leaf(index, t, leaf_id, leaf, word, &path, e, nulls, &r);
					s->leaves[leaf_id].updates++;
					__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
					LWLockRelease(amr_leaf_lock(leaf_id));
				}
			}
			LWLockRelease(amr_tree_lock(t));
		}
		PG_CATCH();
		{
			release_reservation(&r);
			PG_RE_THROW();
		}
		PG_END_TRY();
		release_reservation(&r);
		LWLockRelease(&amr_shared->publish_lock);
		if (!retry)
			return;
	}
}

void
amr_insert_entry(Relation index, AmrTree *t, const AmrLeafEntry *e)
{
	bool		nulls = (e->flags & AMR_ENTRY_FLAG_NULL) != 0;
	AmrFBox		box = entry_box(e);

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
