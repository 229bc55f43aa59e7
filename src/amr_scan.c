/*-------------------------------------------------------------------------
 *
 * amr_scan.c
 *		Index scans: amgettuple (plain and index-only) and amgetbitmap.
 *
 * A scan first collects, under the tree lock in shared mode, the leaves
 * whose level-1 boxes may hold matches (the inner nodes are DRAM, so this is
 * fast), remembering the tree's split counter.  It then visits those leaves
 * one at a time, each under its own leaf lock in shared mode, resolving the
 * leaf id through the Leaf Table so that a leaf moved or rewritten meanwhile
 * is read where it now is.  A leaf split after the collection has an NSN
 * beyond the remembered counter; its right link then leads to the entries
 * that moved (the scheme of GiST's README, applied to leaves only), so no
 * entry that existed when the scan started is missed and none is returned
 * twice.
 *
 * Leaf predicates reproduce PostgreSQL's box operators exactly; a query box
 * with a NaN coordinate is evaluated with the operator itself and prunes
 * nothing, and so is a key with a NaN coordinate (its bounding box is
 * infinite on that side), so the index returns exactly what a sequential
 * scan returns.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"

#include "access/relscan.h"
#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/predicate.h"
#include "utils/geo_decls.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

typedef struct AmrScanOpaqueData
{
	AmrTree    *tree;
	uint32		generation;		/* of the tree when the scan began */
	MemoryContext scan_cxt;
	MemoryContext batch_cxt;

	int			nkeys;
	AmrScanKey *keys;
	ScanKey    *pgkeys;			/* parallel to keys, for NaN queries */
	bool		want_box_side;
	bool		want_null_side;
	bool		no_match;

	bool		started;
	uint64		start_nsn;
	AmrLeafList cand;
	uint32		cand_pos;

	bool		need_pins;
	bool		predicate_locks;	/* SERIALIZABLE: lock what we read */
	uint32		pinned_leaf;
	int			nitems;
	int			item_pos;
	ItemPointerData tids[AMR_LEAF_CAPACITY];
	AmrBox		boxes[AMR_LEAF_CAPACITY];
	bool		isnull[AMR_LEAF_CAPACITY];
	AmrLeaf    *leaf;			/* a leaf copy (aligned) */
	AmrReadAhead readahead;		/* SSD leaves read with one submission */
} AmrScanOpaqueData;

typedef AmrScanOpaqueData *AmrScanOpaque;

static void *
scan_realloc(void *ptr, size_t size, void *arg)
{
	MemoryContext cxt = (MemoryContext) arg;

	if (ptr == NULL)
		return MemoryContextAllocHuge(cxt, size);
	return repalloc_huge(ptr, size);
}

IndexScanDesc
amrbeginscan(Relation r, int nkeys, int norderbys)
{
	IndexScanDesc scan;
	AmrScanOpaque so;

	scan = RelationGetIndexScan(r, nkeys, norderbys);
	so = (AmrScanOpaque) palloc0(sizeof(AmrScanOpaqueData));
	so->tree = amr_tree_open(r);
	so->generation = so->tree->generation;
	so->scan_cxt = CurrentMemoryContext;
	so->batch_cxt = AllocSetContextCreate(CurrentMemoryContext,
										  "amrtree scan batch",
										  ALLOCSET_SMALL_SIZES);
	so->keys = palloc0(sizeof(AmrScanKey) * Max(nkeys, 1));
	so->pgkeys = palloc0(sizeof(ScanKey) * Max(nkeys, 1));
	so->pinned_leaf = AMR_INVALID_LEAF;
	so->leaf = amr_alloc_leaf_buffer();
	amr_readahead_init(&so->readahead);
	scan->opaque = so;
	scan->xs_itupdesc = RelationGetDescr(r);
	return scan;
}

static void
release_batch(AmrScanOpaque so)
{
	if (so->pinned_leaf != AMR_INVALID_LEAF)
	{
		amr_unpin_leaf(so->tree, so->pinned_leaf);
		so->pinned_leaf = AMR_INVALID_LEAF;
	}
	so->nitems = 0;
	so->item_pos = 0;
	MemoryContextReset(so->batch_cxt);
}

void
amrrescan(IndexScanDesc scan, ScanKey scankey, int nscankeys,
		  ScanKey orderbys, int norderbys)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	bool		search_null = false;
	bool		search_not_null = false;
	int			i;

	release_batch(so);
	so->started = false;
	amr_readahead_reset(&so->readahead);
	so->cand.n = 0;
	so->cand_pos = 0;
	so->no_match = false;
	so->nkeys = 0;

	if (scankey && scan->numberOfKeys > 0)
		memmove(scan->keyData, scankey, scan->numberOfKeys * sizeof(ScanKeyData));

	for (i = 0; i < scan->numberOfKeys; i++)
	{
		ScanKey		sk = &scan->keyData[i];
		AmrScanKey *k;
		BOX		   *q;

		if (sk->sk_flags & SK_ISNULL)
		{
			if (sk->sk_flags & SK_SEARCHNULL)
				search_null = true;
			else if (sk->sk_flags & SK_SEARCHNOTNULL)
				search_not_null = true;
			else
				so->no_match = true;	/* the operators are strict */
			continue;
		}
		if (sk->sk_strategy < 1 || sk->sk_strategy > AMR_NUM_STRATEGIES)
			elog(ERROR, "unrecognized strategy number %d for amrtree", sk->sk_strategy);
		q = DatumGetBoxP(sk->sk_argument);
		k = &so->keys[so->nkeys];
		k->strategy = sk->sk_strategy;
		amr_box_from_pg(q, &k->query);
		k->prune = !amr_box_has_nan(&k->query);
		so->pgkeys[so->nkeys] = sk;
		so->nkeys++;
	}

	/* NULL keys live in a tree of their own: visit only what can match */
	if (search_null && (search_not_null || so->nkeys > 0))
		so->no_match = true;
	so->want_box_side = !search_null;
	so->want_null_side = search_null || (so->nkeys == 0 && !search_not_null);

	/*
	 * Pins are needed only where a TID handed out after VACUUM removed its
	 * entry would be trusted: index-only scans (visibility map) and
	 * non-MVCC snapshots.  With an MVCC snapshot a reused TID is invisible.
	 */
	so->need_pins = scan->xs_want_itup ||
		(scan->xs_snapshot != NULL && !IsMVCCSnapshot(scan->xs_snapshot));
	so->predicate_locks = IsolationIsSerializable();
}

/*
 * A scan reads the tree it began on, or fails: never a tree that replaced
 * it under the same tree number.  PostgreSQL's locks make this hold (a tree
 * is freed only when its relation file is unlinked, which waits for every
 * scan), so the error is a backstop that names the broken promise instead of
 * returning another index's rows.
 */
static void
check_tree_unchanged(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTreeRecord *rec = &amr_store.tree_records[so->tree->tree_no];

	if (so->tree->generation != so->generation || rec->generation != so->generation ||
		(rec->state != AMR_TREE_VALID && rec->state != AMR_TREE_BUILDING))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree index \"%s\" was dropped or rebuilt while a scan was reading it",
						RelationGetRelationName(scan->indexRelation))));
}

/* AmrVisitFn: predicate-lock an inner node before the search reads it. */
static void
lock_node_for_read(uint32 node_id, void *arg)
{
	IndexScanDesc scan = (IndexScanDesc) arg;

	PredicateLockPage(scan->indexRelation, amr_pred_node_block(node_id), scan->xs_snapshot);
}

static void
start_scan(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTree    *t = so->tree;

	pgstat_count_index_scan(scan->indexRelation);
	so->started = true;
	so->cand.n = 0;
	so->cand_pos = 0;
	if (so->no_match)
		return;

	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	if (t->generation != so->generation)
	{
		LWLockRelease(amr_tree_lock(t));
		check_tree_unchanged(scan);
	}
	so->start_nsn = amr_sync_read(&t->nsn);
	if (so->want_box_side)
		amr_collect_leaves(&amr_store, t, false, so->keys, so->nkeys, &so->cand,
						   so->predicate_locks ? lock_node_for_read : NULL, scan,
						   scan_realloc, so->scan_cxt);
	if (so->want_null_side)
		amr_collect_leaves(&amr_store, t, true, NULL, 0, &so->cand,
						   so->predicate_locks ? lock_node_for_read : NULL, scan,
						   scan_realloc, so->scan_cxt);
	LWLockRelease(amr_tree_lock(t));
}

static bool
entry_matches(AmrScanOpaque so, const AmrLeafEntry *e)
{
	/* a key with NaN coordinates: exactly as the operator decides */
	bool		use_operator = (e->flags & AMR_ENTRY_FLAG_NAN) != 0;
	int			k;

	for (k = 0; k < so->nkeys; k++)
	{
		if (so->keys[k].prune && !use_operator)
		{
			if (!amr_leaf_match(so->keys[k].strategy, &e->key, &so->keys[k].query))
				return false;
		}
		else
		{
			ScanKey		sk = so->pgkeys[k];
			BOX			b;

			amr_box_set_pg(&b, &e->key);
			if (!DatumGetBool(FunctionCall2Coll(&sk->sk_func, sk->sk_collation,
												BoxPGetDatum(&b), sk->sk_argument)))
				return false;
		}
	}
	return true;
}

/*
 * Read one leaf's matches into the batch.  The leaf is copied (or read
 * from SSD) by the leaf store and evaluated afterwards, so no operator
 * ever runs with a lock held.
 */
static void
load_leaf(IndexScanDesc scan, uint32 leaf_id)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTree    *t = so->tree;
	const AmrLeaf *img;
	uint32		follow;
	int			n;
	int			i;

	so->nitems = 0;
	so->item_pos = 0;
	if (so->need_pins)
	{
		amr_pin_leaf(t, leaf_id);
		so->pinned_leaf = leaf_id;
	}
	/* before reading it: a write after our read must find the lock */
	if (so->predicate_locks)
		PredicateLockPage(scan->indexRelation, amr_pred_leaf_block(leaf_id),
						  scan->xs_snapshot);

	img = amr_leaf_read_for_scan(scan->indexRelation, t, so->generation, leaf_id,
								 so->start_nsn, &so->readahead, so->leaf, &follow);
	/* a leaf of a live tree is never freed: if it is gone, so is the tree */
	if (img == NULL || img->hdr.tree_generation != so->generation)
	{
		check_tree_unchanged(scan);
		return;
	}
	/* split after we collected the candidates: follow the moved entries */
	if (follow != AMR_INVALID_LEAF)
		amr_leaf_list_push(&so->cand, follow, scan_realloc, so->scan_cxt);

	n = (int) img->hdr.nentries;
	for (i = 0; i < n; i++)
	{
		const AmrLeafEntry *en = &img->entries[i];
		bool		isnull = (en->flags & AMR_ENTRY_FLAG_NULL) != 0;

		if (en->flags & AMR_ENTRY_FLAG_DEAD)
			continue;
		if (isnull ? !so->want_null_side : !entry_matches(so, en))
			continue;
		memcpy(&so->tids[so->nitems], &en->tid_blk_hi, sizeof(ItemPointerData));
		so->boxes[so->nitems] = en->key;
		so->isnull[so->nitems] = isnull;
		so->nitems++;
	}
}

static bool
next_batch(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;

	for (;;)
	{
		release_batch(so);
		if (so->cand_pos >= so->cand.n)
			return false;
		CHECK_FOR_INTERRUPTS();
		amr_readahead(&so->readahead, scan->indexRelation, &so->cand.ids[so->cand_pos],
					  (int) (so->cand.n - so->cand_pos));
		load_leaf(scan, so->cand.ids[so->cand_pos++]);
		if (so->nitems > 0)
			return true;
	}
}

bool
amrgettuple(IndexScanDesc scan, ScanDirection dir)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;

	if (dir != ForwardScanDirection)
		elog(ERROR, "amrtree only supports forward scans");
	if (!so->started)
		start_scan(scan);

	for (;;)
	{
		if (so->item_pos < so->nitems)
		{
			int			i = so->item_pos++;

			scan->xs_heaptid = so->tids[i];
			scan->xs_recheck = false;
			if (scan->xs_want_itup)
			{
				MemoryContext old = MemoryContextSwitchTo(so->batch_cxt);
				Datum		value = (Datum) 0;
				bool		isnull = so->isnull[i];

				if (!isnull)
					value = BoxPGetDatum(amr_box_to_pg(&so->boxes[i]));
				scan->xs_itup = index_form_tuple(scan->xs_itupdesc, &value, &isnull);
				MemoryContextSwitchTo(old);
			}
			return true;
		}
		if (!next_batch(scan))
			return false;
	}
}

int64
amrgetbitmap(IndexScanDesc scan, TIDBitmap *tbm)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	int64		ntids = 0;

	/* every TID is in the bitmap before this returns: no pins needed */
	so->need_pins = false;
	start_scan(scan);
	while (next_batch(scan))
	{
		tbm_add_tuples(tbm, so->tids, so->nitems, false);
		ntids += so->nitems;
	}
	return ntids;
}

void
amrendscan(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;

	release_batch(so);
	MemoryContextDelete(so->batch_cxt);
}
