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
 * Ordered scans ("ORDER BY key <-> point", strategy 15) run the best-first
 * search of core/amr_knn.h instead of the collection: it reads inner nodes
 * under the tree lock in shared mode, one step at a time, and leaves as
 * the queue reaches them; entries come out by distance, the NULL side
 * last.
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
#include "core/amr_knn.h"

#include "access/relscan.h"
#include "access/xact.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/predicate.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/fmgroids.h"
#include "utils/geo_decls.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

typedef struct AmrKnnHit AmrKnnHit;

/*
 * A leaf an ordered scan that needs pins read, and what it takes to know,
 * when one of the entries copied from it is returned, that VACUUM has not
 * removed the entry since (knn_hold_returned).
 */
typedef struct AmrKnnRead
{
	uint32		leaf_id;
	bool		quiet;			/* no removal pass was under way */
	uint64		removals;		/* removal passes begun on the tree by then */
	uint64		nsn;			/* the tree's split counter by then */
} AmrKnnRead;
typedef struct AmrKnnTie AmrKnnTie;

typedef struct AmrScanOpaqueData
{
	AmrTree    *tree;
	uint32		generation;		/* of the tree when the scan began */
	MemoryContext scan_cxt;
	MemoryContext batch_cxt;
	MemoryContext eval_cxt;		/* operators and fetches on one leaf's keys */
	MemoryContext key_cxt;		/* the query boxes' computation, per rescan */

	int			nkeys;
	AmrScanKey *keys;
	ScanKey    *pgkeys;			/* parallel to keys, for NaN queries */
	bool	   *lossy;			/* parallel to keys: bounding-box filter only */
	bool	   *float4_overlap; /* parallel to keys: decided on the float4 box */
	FmgrInfo   *bbox_fns;		/* parallel to scan->keyData (not keys[]: a
								 * NULL key takes no place there, and the
								 * others' places shift from rescan to
								 * rescan): query argument -> box */
	bool		recheck;		/* some key is lossy: executor rechecks */
	bool		key_exact;		/* a key determines the value (box, point) */
	bool		want_box_side;
	bool		want_null_side;
	bool		no_match;

	bool		started;
	bool		resync_known;	/* resync_seq holds the tree's, as the scan
								 * first read the inner nodes */
	uint64		resync_seq;
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
	bool		item_recheck[AMR_LEAF_CAPACITY];
	AmrLeaf    *leaf;			/* a leaf copy (aligned) */
	AmrReadAhead readahead;		/* SSD leaves read with one submission */
	IndexTuple	itup_template;	/* index-only scans: rewritten per row */
	Size		itup_data_off;
	int			itup_value_len;
	bool		itup_box;		/* the template's value is the stored box */

	/* ordered scans */
	bool		ordered;		/* ORDER BY key <-> point */
	bool		order_exact;	/* distances exact (box_ops), else bounds */
	int			order_key;		/* the ORDER BY the search follows: the first
								 * with an argument (those before it are NULL
								 * for every row) */
	bool		knn_box_done;	/* the box side is exhausted: NULLs next */
	int			order_fast;		/* ORDER_FAST_*: the distance without fmgr */
	AmrBox		order_box;		/* the query point, or its value's box */
	FmgrInfo	order_bbox_fn;	/* the query value -> box */
	AmrKnnBoundFn order_bound;	/* by support function 3, or NULL: the planar
								 * distance bounds a lossy key */
	void	   *order_bound_arg;
	AmrKnnSearch knn;
	AmrKnnHit  *hits;			/* entries fed to the search, by payload */
	size_t		nhits;			/* payloads handed out (live or free) */
	size_t		hits_capacity;
	uint64	   *free_hits;		/* payloads of rows returned, to reuse */
	size_t		nfree_hits;
	uint32	   *hit_read;		/* with pins: each hit's knn_reads entry */
	AmrKnnRead *knn_reads;		/* with pins: the leaves the search read */
	int			nknn_reads;
	int			knn_reads_capacity;
	uint32		returned_leaf;	/* pinned for the row returned last */

	/* more than one ORDER BY over exact keys: ties of the first, sorted */
	bool		order_ties;
	int			tie_width;		/* the ORDER BYs after order_key */
	AmrKnnTie  *ties;			/* the group of rows at one first distance */
	double	   *tie_values;		/* per row, the further ORDER BYs' distances */
	bool	   *tie_nulls;
	int			ntie;
	int			tie_pos;
	int			ties_capacity;
	bool		have_ahead;		/* the row after the group, already taken */
	uint64		ahead_payload;
	double		ahead_distance;
} AmrScanOpaqueData;

typedef AmrScanOpaqueData *AmrScanOpaque;

/*
 * Exact distances the tree core reproduces bit for bit (core/amr_geom.h,
 * tested against PostgreSQL's functions in test/core): computed inline for
 * keys and query points without NaN, saving an fmgr call per entry.
 */
#define ORDER_FAST_NONE			0
#define ORDER_FAST_BOX_POINT	1	/* box_ops: dist_bp(box, point) */
#define ORDER_FAST_POINT_POINT	2	/* point_ops: point_distance(point, point) */

/*
 * Most entries fed to the queue are never reached: a LIMIT 10 reads a few
 * leaves of some 75 entries.  So an entry goes in under a cheap lower bound
 * -- the larger of its gaps to the query along the axes, no square root
 * (amr_box_point_axis_bound, which allows for dist_bp's fuzz, and
 * amr_point_point_axis_bound; amr_knn_add_entry_bound) -- and only when it
 * reaches the head of the queue is its distance computed (AMR_KNN_REFINE):
 * dist_bp's exact reproduction costs four segment projections, and either
 * distance a hypot.
 */

/* An entry an ordered scan fed to the search: what to return for it. */
struct AmrKnnHit
{
	ItemPointerData tid;
	AmrBox		key;
};

/*
 * A row of a tie group (see knn_fill_ties): its hit, its first distance, and
 * where its further distances are in tie_values / tie_nulls.
 */
struct AmrKnnTie
{
	uint64		payload;
	double		distance;
	int			row;			/* its place in the group as the search gave
								 * it */
};

static void *
scan_realloc(void *ptr, size_t size, void *arg)
{
	MemoryContext cxt = (MemoryContext) arg;

	if (ptr == NULL)
		return MemoryContextAllocHuge(cxt, size);
	return repalloc_huge(ptr, size);
}

/*
 * PostGIS's 2D `&&` (gserialized_overlaps_2d) is by definition the overlap
 * of the two values' float4 boxes, which is what a geometry_ops_2d key
 * stores (amrtree_float4_bbox: PostGIS's box rounded outward to float4, as
 * PostGIS rounds it).  For ordinary boxes -- finite, inside float4's range,
 * no NaN -- the leaf can decide it exactly, without the executor's recheck
 * (which detoasts every row's geometry): PostGIS's own GiST class never
 * rechecks.  Anything unusual (empty geometries, infinite or huge
 * coordinates, where the two roundings could differ) is still returned
 * for recheck, so no row is decided on a box that might not be PostGIS's.
 */
static bool
float4_box_is_ordinary(const AmrBox *b)
{
	return fabs(b->xlo) < FLT_MAX && fabs(b->ylo) < FLT_MAX &&
		fabs(b->xhi) < FLT_MAX && fabs(b->yhi) < FLT_MAX;
}

static bool
is_float4_box_overlap(Oid fn_oid)
{
	static Oid	cached_oid = InvalidOid;
	static bool cached_result = false;
	HeapTuple	tup;
	bool		result = false;

	if (fn_oid == cached_oid)
		return cached_result;
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	if (HeapTupleIsValid(tup))
	{
		Form_pg_proc proc = (Form_pg_proc) GETSTRUCT(tup);
		bool		isnull;
		Datum		src,
					bin;

		if (proc->prolang == ClanguageId)
		{
			src = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_prosrc, &isnull);
			if (!isnull && strcmp(TextDatumGetCString(src), "gserialized_overlaps_2d") == 0)
			{
				bin = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_probin, &isnull);
				result = !isnull && strstr(TextDatumGetCString(bin), "postgis") != NULL;
			}
		}
		ReleaseSysCache(tup);
	}
	cached_oid = fn_oid;
	cached_result = result;
	return result;
}

/* The key's float4 box overlaps the query's: PostGIS's box2df_overlaps. */
static inline bool
float4_boxes_overlap(const AmrBox *k, const AmrBox *q)
{
	return k->xlo <= q->xhi && q->xlo <= k->xhi && k->ylo <= q->yhi && q->ylo <= k->yhi;
}

/*
 * The bound of a key box (a node's, a leaf's or an entry's) by the operator
 * class's support function 3 (AmrKnnBoundFn; arg is its FmgrInfo): the box
 * and the query's box go by reference, as the function only reads them.
 */
static double
class_distance_bound(const AmrFBox *b, const AmrBox *q, void *arg)
{
	BOX			key;
	BOX			query;

	key.low.x = b->xlo;
	key.low.y = b->ylo;
	key.high.x = b->xhi;
	key.high.y = b->yhi;
	query.low.x = q->xlo;
	query.low.y = q->ylo;
	query.high.x = q->xhi;
	query.high.y = q->yhi;
	return DatumGetFloat8(FunctionCall2((FmgrInfo *) arg, BoxPGetDatum(&key),
										BoxPGetDatum(&query)));
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
	so->eval_cxt = AllocSetContextCreate(CurrentMemoryContext,
										 "amrtree scan leaf",
										 ALLOCSET_SMALL_SIZES);
	so->key_cxt = AllocSetContextCreate(CurrentMemoryContext,
										"amrtree scan keys",
										ALLOCSET_SMALL_SIZES);
	so->keys = palloc0(sizeof(AmrScanKey) * Max(nkeys, 1));
	so->pgkeys = palloc0(sizeof(ScanKey) * Max(nkeys, 1));
	so->lossy = palloc0(sizeof(bool) * Max(nkeys, 1));
	so->float4_overlap = palloc0(sizeof(bool) * Max(nkeys, 1));
	so->bbox_fns = palloc0(sizeof(FmgrInfo) * Max(nkeys, 1));
	so->pinned_leaf = AMR_INVALID_LEAF;
	so->returned_leaf = AMR_INVALID_LEAF;
	so->leaf = amr_alloc_leaf_buffer();
	amr_readahead_init(&so->readahead);
	amr_knn_init(&so->knn, scan_realloc, so->scan_cxt);
	if (norderbys > 0)
	{
		/* the AM provides these (genam.c leaves them unset) */
		scan->xs_orderbyvals = palloc0(sizeof(Datum) * norderbys);
		scan->xs_orderbynulls = palloc(sizeof(bool) * norderbys);
		memset(scan->xs_orderbynulls, true, sizeof(bool) * norderbys);
	}
	scan->opaque = so;
	scan->xs_itupdesc = RelationGetDescr(r);
	return scan;
}

/* Unpin the leaf an ordered scan pinned for the row it returned last. */
static void
release_returned_leaf(AmrScanOpaque so)
{
	if (so->returned_leaf != AMR_INVALID_LEAF)
	{
		amr_unpin_leaf(so->tree, so->returned_leaf);
		so->returned_leaf = AMR_INVALID_LEAF;
	}
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
	MemoryContext old_cxt;
	int			i;

	release_batch(so);

	/*
	 * What the bounding-box functions allocate for the query values goes with
	 * the next rescan: a nested loop rescans once per outer row, and in the
	 * executor's context it stayed until the end of the query.
	 */
	MemoryContextReset(so->key_cxt);
	so->started = false;
	so->resync_known = false;
	amr_readahead_reset(&so->readahead);
	so->cand.n = 0;
	so->cand_pos = 0;
	so->no_match = false;
	so->nkeys = 0;

	release_returned_leaf(so);
	so->nknn_reads = 0;
	so->nhits = 0;
	so->nfree_hits = 0;
	so->recheck = false;
	so->key_exact = amr_opclass_keys_exact(scan->indexRelation);
	so->ordered = false;
	so->order_key = 0;
	so->knn_box_done = false;
	so->order_ties = false;
	so->ntie = 0;
	so->tie_pos = 0;
	so->have_ahead = false;

	if (scankey && scan->numberOfKeys > 0)
		memmove(scan->keyData, scankey, scan->numberOfKeys * sizeof(ScanKeyData));
	if (orderbys && scan->numberOfOrderBys > 0)
		memmove(scan->orderByData, orderbys, scan->numberOfOrderBys * sizeof(ScanKeyData));

	for (i = 0; i < scan->numberOfKeys; i++)
	{
		ScanKey		sk = &scan->keyData[i];
		AmrScanKey *k;
		Oid			subtype;

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
		k = &so->keys[so->nkeys];

		/*
		 * No subtype: a key PostgreSQL built itself from a value of the
		 * indexed column (an exclusion constraint's check), not from an
		 * operator's right argument.
		 */
		subtype = OidIsValid(sk->sk_subtype) ? sk->sk_subtype :
			scan->indexRelation->rd_opcintype[0];
		old_cxt = MemoryContextSwitchTo(so->key_cxt);
		so->lossy[so->nkeys] = amr_scankey_from_pg(scan->indexRelation, sk->sk_strategy,
												   subtype, sk->sk_argument,
												   &so->bbox_fns[i],
												   so->scan_cxt, k);
		MemoryContextSwitchTo(old_cxt);
		so->recheck |= so->lossy[so->nkeys] && !so->key_exact;
		so->float4_overlap[so->nkeys] = so->lossy[so->nkeys] && !so->key_exact &&
			amr_strategy_relation(sk->sk_strategy) == AMR_STRAT_OVERLAP &&
			subtype == scan->indexRelation->rd_opcintype[0] &&
			float4_box_is_ordinary(&k->query) &&
			is_float4_box_overlap(sk->sk_func.fn_oid);
		so->pgkeys[so->nkeys] = sk;
		so->nkeys++;
	}

	/*
	 * Ordering: by the first ORDER BY.  Over exact keys (box, point) the
	 * distances are exact, and rows at equal first distance are sorted by the
	 * further ORDER BYs here (knn_fill_ties), so that every value returned is
	 * exact -- as GiST does, and as index-only scans need: the executor
	 * cannot reorder them.  Over lossy keys every distance is a lower bound,
	 * the further ones -Infinity, and the executor rechecks and reorders.
	 */
	if (scan->numberOfOrderBys > 0)
	{
		ScanKey		ok = NULL;

		/*
		 * An ORDER BY whose argument is NULL (a parameter, a LATERAL
		 * reference) is NULL for every row: the rows are ordered by the first
		 * one that has an argument, as GiST orders them.
		 */
		for (i = 0; i < scan->numberOfOrderBys; i++)
		{
			ScanKey		k = &scan->orderByData[i];

			if (!amr_is_ordering_strategy(k->sk_strategy))
				elog(ERROR, "unrecognized ordering strategy number %d for amrtree",
					 k->sk_strategy);
			if (ok == NULL && !(k->sk_flags & SK_ISNULL))
			{
				ok = k;
				so->order_key = i;
			}
		}
		/* every argument NULL: every distance is NULL, the scan unordered */
		if (ok != NULL)
		{
			so->ordered = true;
			if (ok->sk_subtype == POINTOID)
			{
				Point	   *p = DatumGetPointP(ok->sk_argument);

				so->order_box.xlo = so->order_box.xhi = p->x;
				so->order_box.ylo = so->order_box.yhi = p->y;
			}
			else
			{
				old_cxt = MemoryContextSwitchTo(so->key_cxt);
				amr_query_box(scan->indexRelation, ok->sk_subtype, ok->sk_argument,
							  &so->order_bbox_fn, so->scan_cxt, &so->order_box);
				MemoryContextSwitchTo(old_cxt);
			}
			so->order_exact = so->key_exact;
			so->order_bound = NULL;
			if (!so->order_exact &&
				OidIsValid(index_getprocid(scan->indexRelation, 1, AMR_DISTANCE_PROC)))
			{
				FmgrInfo   *fn = index_getprocinfo(scan->indexRelation, 1,
												   AMR_DISTANCE_PROC);

				/* geography's own bound without fmgr, as order_fast does */
				so->order_bound = amr_is_geography_bound(fn) ?
					amr_geography_bound : class_distance_bound;
				so->order_bound_arg = fn;
			}

			/*
			 * A lossy class's distance is the operator's, which the index
			 * only bounds by the key's box.  An infinite query coordinate can
			 * meet an infinite one of the value in inf - inf, whose NaN makes
			 * dist_ppoly() 0 for a polygon far from the point (see
			 * amrtree_poly_bbox): no box bounds that, so such a search orders
			 * by the bound 0 (a NaN query box gives it everywhere) and leaves
			 * the order to the executor's recheck.
			 */
			if (!so->order_exact &&
				(isinf(so->order_box.xlo) || isinf(so->order_box.ylo) ||
				 isinf(so->order_box.xhi) || isinf(so->order_box.yhi)))
				so->order_box.xlo = so->order_box.ylo =
					so->order_box.xhi = so->order_box.yhi = get_float8_nan();
			so->tie_width = scan->numberOfOrderBys - 1 - so->order_key;
			so->order_ties = so->order_exact && so->tie_width > 0;
			so->order_fast = ORDER_FAST_NONE;
			if (so->order_exact && ok->sk_subtype == POINTOID &&
				!amr_box_has_nan(&so->order_box))
			{
				Oid			keytype = scan->indexRelation->rd_opcintype[0];

				if (ok->sk_func.fn_oid == F_DIST_BP && keytype == BOXOID)
					so->order_fast = ORDER_FAST_BOX_POINT;
				else if (ok->sk_func.fn_oid == F_POINT_DISTANCE && keytype == POINTOID)
					so->order_fast = ORDER_FAST_POINT_POINT;
			}
		}
	}

	/* NULL keys live in a tree of their own: visit only what can match */
	if (search_null && (search_not_null || so->nkeys > 0))
		so->no_match = true;
	so->want_box_side = !search_null;
	so->want_null_side = search_null || (so->nkeys == 0 && !search_not_null);

	/*
	 * Pins are needed only where a TID handed out after VACUUM removed its
	 * entry would be trusted: index-only scans (visibility map) and non-MVCC
	 * snapshots.  With an MVCC snapshot a reused TID is invisible.
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

static pg_noinline void
report_resync(IndexScanDesc scan)
{
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("canceling statement due to conflict with recovery"),
			 errdetail("WAL replay logged leaves of amrtree index \"%s\" again, as the primary's crash recovery found them, while the scan was reading them.",
					   RelationGetRelationName(scan->indexRelation)),
			 errhint("Retry the query.")));
}

/*
 * Hot standby: has WAL replay applied a resync record to the tree since the
 * scan first read its inner nodes (amr_walredo.c, redo_resync)?  The leaves
 * the scan read before it and those it reads after may then disagree --
 * entries moved between them by a split whose record the primary lost, with
 * no right link to follow -- and the scan could miss rows or return some
 * twice, so it stops instead.  Checked after every leaf read, and at every
 * later look at the inner nodes.  Never true on a primary.
 */
static inline void
check_no_resync(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;

	/* the leaf was read under its lock, before this load */
	if (unlikely(amr_sync_read(&so->tree->resync_seq) != so->resync_seq))
		report_resync(scan);
}

/*
 * Take the tree lock in shared mode to read the inner nodes of the tree the
 * scan began on, packed: on a standby, WAL replay may have left them stale
 * (amr_tree_pack_if_stale) since the scan opened the tree, and a leaf they
 * do not hold would be missed.
 *
 * The first time, on a hot standby, wait while replay applies a resync
 * record to the tree, so that the scan sees all of its images or none, and
 * refuse a tree that has received only some of the parts of one; from then
 * on the tree must not have been resynchronised (check_no_resync).
 */
static void
lock_tree_for_read(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTree    *t = so->tree;

	for (;;)
	{
		uint64		seq;

		LWLockAcquire(amr_tree_lock(t), LW_SHARED);
		if (t->generation != so->generation)
		{
			LWLockRelease(amr_tree_lock(t));
			check_tree_unchanged(scan);
		}
		seq = amr_sync_read(&t->resync_seq);
		if (so->resync_known)
		{
			if (unlikely(seq != so->resync_seq))
			{
				LWLockRelease(amr_tree_lock(t));
				report_resync(scan);
			}
		}
		else if (unlikely(seq & 1))
		{
			/* replay is applying a resync record: it takes milliseconds */
			LWLockRelease(amr_tree_lock(t));
			CHECK_FOR_INTERRUPTS();
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 1L, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			continue;
		}
		else if (unlikely(amr_store.tree_records[t->tree_no].flags & AMR_TREE_FLAG_RESYNC_OPEN))
		{
			LWLockRelease(amr_tree_lock(t));
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("amrtree index \"%s\" cannot be used until WAL replay has all of a resynchronisation of it",
							RelationGetRelationName(scan->indexRelation)),
					 errdetail("The primary's crash recovery logged the index's changed leaves again in several records, and this standby has replayed only some of them."),
					 errhint("Retry once replay has passed them.  If the primary is lost, the index is rebuilt after this standby is promoted.")));
		}
		else
		{
			so->resync_seq = seq;
			so->resync_known = true;
		}
		if (!t->inner_stale)
			return;
		LWLockRelease(amr_tree_lock(t));
		amr_tree_pack_if_stale(t);
	}
}

/* AmrVisitFn: predicate-lock an inner node before the search reads it. */
static void
lock_node_for_read(uint32 node_id, void *arg)
{
	IndexScanDesc scan = (IndexScanDesc) arg;

	PredicateLockPage(scan->indexRelation, amr_pred_node_block(node_id), scan->xs_snapshot);
}

static pg_noinline void
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

	lock_tree_for_read(scan);
	so->start_nsn = amr_sync_read(&t->nsn);
	if (so->ordered)
	{
		/* the box side is searched by distance; the NULL side comes last */
		LWLockRelease(amr_tree_lock(t));
		if (so->predicate_locks)
			PredicateLockRelation(scan->indexRelation, scan->xs_snapshot);
		amr_knn_begin_box(&so->knn, &amr_store, t, &so->order_box);
		amr_knn_set_lossy(&so->knn, !so->order_exact);
		if (so->order_bound)
			amr_knn_set_bound_fn(&so->knn, so->order_bound, so->order_bound_arg);
		return;
	}
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

/*
 * Does the entry match every key?  *recheck is set when some lossy key
 * could not decide it, so the executor must test the operator on the row.
 */
static bool
entry_matches(IndexScanDesc scan, const AmrLeafEntry *e, bool *recheck)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	Datum		value = (Datum) 0;

	/* a key with NaN coordinates: exactly as the operator decides */
	bool		use_operator = (e->flags & AMR_ENTRY_FLAG_NAN) != 0;
	int			k;

	*recheck = false;
	for (k = 0; k < so->nkeys; k++)
	{
		if (so->lossy[k])
		{
			/* the box relation is only a filter for this operator */
			if (so->keys[k].prune && !use_operator &&
				!amr_leaf_match(so->keys[k].strategy, &e->key, &so->keys[k].query))
				return false;
			if (so->float4_overlap[k] && !use_operator && float4_box_is_ordinary(&e->key))
			{
				/* PostGIS's && on two ordinary float4 boxes: decided here */
				if (!float4_boxes_overlap(&e->key, &so->keys[k].query))
					return false;
				continue;
			}
			if (!so->key_exact)
				*recheck = true;
			/* the key determines the value: decide exactly, else recheck */
			if (so->key_exact)
			{
				ScanKey		sk = so->pgkeys[k];

				if (value == (Datum) 0)
					value = amr_key_value(scan->indexRelation, &e->key);
				if (!DatumGetBool(FunctionCall2Coll(&sk->sk_func, sk->sk_collation,
													value, sk->sk_argument)))
					return false;
			}
		}
		else if (so->keys[k].prune && !use_operator)
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

/* Item i of the batch is entry e, a match (recheck: the executor tests the row). */
static inline void
batch_put(AmrScanOpaque so, int i, const AmrLeafEntry *e, bool isnull, bool recheck)
{
	memcpy(&so->tids[i], &e->tid_blk_hi, sizeof(ItemPointerData));
	so->boxes[i] = e->key;
	so->isnull[i] = isnull;
	so->item_recheck[i] = recheck;
}

/*
 * AmrLeafCopyFn: copy a leaf's header and the entries that pass the keys'
 * box tests (amr_leaf_match: plain arithmetic, safe under the leaf lock).
 * It drops only entries that entry_matches would drop too, so evaluating
 * the copy afterwards gives the same answer as evaluating the whole image;
 * on a small window most of a leaf is left behind, and the copy and the
 * evaluation shrink to the few entries that can match.
 *
 * A lone exact `&&` key (box_ops, point_ops) is decided here outright: the
 * test below is entry_matches' whole test for an ordinary entry, so its
 * matches go straight into the batch and only NaN keys are copied, for the
 * operator to decide after the lock is released.  Each match is read once
 * instead of copied and read again; that was a seventh of an index-only
 * scan's time on coastline windows.
 */
static void
copy_candidates(const AmrLeaf *src, AmrLeaf *dst, void *arg)
{
	AmrScanOpaque so = (AmrScanOpaque) arg;
	int			n = (int) Min(src->hdr.nentries, AMR_LEAF_CAPACITY);
	int			ncopied = 0;
	int			i;

	dst->hdr = src->hdr;
	if (so->nkeys == 1 && so->keys[0].prune && so->keys[0].strategy == AMR_STRAT_OVERLAP &&
		!so->want_null_side)
	{
		/* amr_leaf_match's overlap test, bounds plus epsilon hoisted */
		const double qxlo = so->keys[0].query.xlo;
		const double qylo = so->keys[0].query.ylo;
		const double qxhi = so->keys[0].query.xhi + AMR_EPSILON;
		const double qyhi = so->keys[0].query.yhi + AMR_EPSILON;
		const bool	decide = !so->lossy[0];
		int			nitems = so->nitems;

		for (i = 0; i < n; i++)
		{
			const AmrLeafEntry *e = &src->entries[i];
			bool		hit = (e->key.xlo <= qxhi) & (qxlo <= e->key.xhi + AMR_EPSILON) &
			(e->key.ylo <= qyhi) & (qylo <= e->key.yhi + AMR_EPSILON);

			if (e->flags == 0)
			{
				if (!hit)
					continue;
				if (decide)
				{
					batch_put(so, nitems++, e, false, false);
					continue;
				}
			}
			/* NULL and dead entries are not wanted */
			else if (e->flags != AMR_ENTRY_FLAG_NAN)
				continue;
			/* a NaN key goes to the operator; a lossy key's hit to its tests */
			dst->entries[ncopied++] = *e;
		}
		so->nitems = nitems;
		dst->hdr.nentries = ncopied;
		return;
	}
	for (i = 0; i < n; i++)
	{
		const AmrLeafEntry *e = &src->entries[i];

		if (e->flags & AMR_ENTRY_FLAG_DEAD)
			continue;
		if (e->flags & AMR_ENTRY_FLAG_NULL)
		{
			if (!so->want_null_side)
				continue;
		}
		else if ((e->flags & AMR_ENTRY_FLAG_NAN) == 0)
		{
			int			k;

			for (k = 0; k < so->nkeys; k++)
				if (so->keys[k].prune &&
					!amr_leaf_match(so->keys[k].strategy, &e->key, &so->keys[k].query))
					break;
			if (k < so->nkeys)
				continue;
		}
		dst->entries[ncopied++] = *e;
	}
	dst->hdr.nentries = ncopied;
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
	MemoryContext old_cxt;
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

	/* copy_candidates may put matches in the batch; SSD images come whole */
	img = amr_leaf_read_for_scan(scan->indexRelation, t, so->generation, leaf_id,
								 so->start_nsn, &so->readahead, so->leaf,
								 copy_candidates, so, &follow);
	/* a leaf of a live tree is never freed: if it is gone, so is the tree */
	if (img == NULL || img->hdr.tree_generation != so->generation)
	{
		so->nitems = 0;
		check_tree_unchanged(scan);
		return;
	}
	check_no_resync(scan);
	/* split after we collected the candidates: follow the moved entries */
	if (follow != AMR_INVALID_LEAF)
		amr_leaf_list_push(&so->cand, follow, scan_realloc, so->scan_cxt);

	n = (int) img->hdr.nentries;
	MemoryContextReset(so->eval_cxt);
	old_cxt = MemoryContextSwitchTo(so->eval_cxt);
	for (i = 0; i < n; i++)
	{
		const AmrLeafEntry *en = &img->entries[i];
		bool		isnull = (en->flags & AMR_ENTRY_FLAG_NULL) != 0;
		bool		recheck = false;

		if (en->flags & AMR_ENTRY_FLAG_DEAD)
			continue;
		if (isnull ? !so->want_null_side : !entry_matches(scan, en, &recheck))
			continue;
		batch_put(so, so->nitems++, en, isnull, recheck);
	}
	MemoryContextSwitchTo(old_cxt);
}

static pg_noinline bool
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

/*
 * The index tuple of an index-only scan, formed: a NULL key, the first row
 * of a scan, and values that are not fixed-length by reference.  The first
 * fixed-length value's tuple is kept as the template set_index_tuple
 * rewrites for the following rows.
 */
static pg_noinline void
form_index_tuple(IndexScanDesc scan, const AmrBox *key, bool isnull)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	MemoryContext old = MemoryContextSwitchTo(so->batch_cxt);
	Datum		values[INDEX_MAX_KEYS];
	bool		nulls[INDEX_MAX_KEYS];

	/* INCLUDE columns are not stored: amrcanreturn keeps them out of here */
	memset(nulls, true, sizeof(nulls));
	values[0] = (Datum) 0;
	nulls[0] = isnull;
	if (!isnull)
		values[0] = amr_key_value(scan->indexRelation, key);
	scan->xs_itup = index_form_tuple(scan->xs_itupdesc, values, nulls);
	if (!isnull)
	{
		Form_pg_attribute att = TupleDescAttr(scan->xs_itupdesc, 0);

		/* a fixed-length value by reference: keep this tuple to rewrite */
		if (att->attlen > 0 && !att->attbyval)
		{
			MemoryContextSwitchTo(so->scan_cxt);
			so->itup_template = CopyIndexTuple(scan->xs_itup);
			so->itup_data_off = IndexInfoFindDataOffset(so->itup_template->t_info);
			so->itup_value_len = att->attlen;
			so->itup_box = amr_opclass_exact(scan->indexRelation);
		}
	}
	MemoryContextSwitchTo(old);
}

/*
 * The index tuple of an index-only scan: the key's value (box_ops: the
 * stored box; classes with a fetch function: its value).  When that value
 * has a fixed length (box, point), one tuple is formed per scan and each
 * row's value is written into it in place: the executor reads xs_itup only
 * until the next amgettuple call, and forming a tuple per row was a sixth
 * of an index-only scan's time on small windows.  This runs once per row,
 * so the forming lives apart (its arrays cost every call a large frame).
 */
static inline void
set_index_tuple(IndexScanDesc scan, const AmrBox *key, bool isnull)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	char	   *data;

	/*
	 * A class whose key is not the value (polygons, circles, geometries) has
	 * no column to return; the planner chose an index-only scan anyway
	 * because the query reads no column (SELECT count(*)), so NULL will do,
	 * as GiST returns it.
	 */
	if (!so->key_exact)
		isnull = true;
	if (isnull || so->itup_template == NULL)
	{
		form_index_tuple(scan, key, isnull);
		return;
	}
	data = (char *) so->itup_template + so->itup_data_off;
	if (so->itup_box)
		amr_box_set_pg((BOX *) data, key);
	else
	{
		/* the fetch function allocates: in the batch's context */
		MemoryContext old = MemoryContextSwitchTo(so->batch_cxt);

		memcpy(data, DatumGetPointer(amr_key_value(scan->indexRelation, key)),
			   so->itup_value_len);
		MemoryContextSwitchTo(old);
	}
	scan->xs_itup = so->itup_template;
}

/*
 * Rows whose distance is NULL: a NULL key, or ORDER BY ... <-> NULL.  They
 * follow every row with a distance, as NULLS LAST puts them.
 */
static void
set_null_distances(IndexScanDesc scan)
{
	int			i;

	for (i = 0; i < scan->numberOfOrderBys; i++)
	{
		scan->xs_orderbyvals[i] = (Datum) 0;
		scan->xs_orderbynulls[i] = true;
	}
	scan->xs_recheckorderby = false;
}

/* After the box side of an ordered scan: collect the NULL side's leaves. */
static pg_noinline void
collect_null_side(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTree    *t = so->tree;

	release_batch(so);
	so->cand.n = 0;
	so->cand_pos = 0;
	lock_tree_for_read(scan);
	so->start_nsn = amr_sync_read(&t->nsn);
	amr_collect_leaves(&amr_store, t, true, NULL, 0, &so->cand, NULL, NULL,
					   scan_realloc, so->scan_cxt);
	LWLockRelease(amr_tree_lock(t));
}

/*
 * A payload for a new hit: one whose row was returned, else a new one.  A
 * scan of the whole index in order thus holds only the entries still
 * queued, not every entry it has returned.
 */
static uint64
knn_new_hit(AmrScanOpaque so)
{
	if (so->nfree_hits > 0)
		return so->free_hits[--so->nfree_hits];
	if (so->nhits == so->hits_capacity)
	{
		so->hits_capacity = Max(256, so->hits_capacity * 2);
		so->hits = scan_realloc(so->hits, sizeof(AmrKnnHit) * so->hits_capacity,
								so->scan_cxt);
		so->free_hits = scan_realloc(so->free_hits, sizeof(uint64) * so->hits_capacity,
									 so->scan_cxt);
		if (so->need_pins)
			so->hit_read = scan_realloc(so->hit_read, sizeof(uint32) * so->hits_capacity,
										so->scan_cxt);
	}
	return so->nhits++;
}

/*
 * Read a leaf the search reached and feed its matching entries: the exact
 * distance (box_ops: the ordering operator itself, so the order is the one
 * the executor would compute) or a lower bound from the bounding box, which
 * the executor rechecks and reorders by.
 */
static void
knn_read_leaf(IndexScanDesc scan, const AmrKnnResult *r)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTree    *t = so->tree;
	ScanKey		ok = &scan->orderByData[so->order_key];
	const AmrLeaf *img;
	uint32		follow;
	MemoryContext old_cxt;
	int			read = -1;
	int			i;

	/*
	 * With pins: the leaf is not pinned while its entries wait in the queue
	 * (see knn_hold_returned); what VACUUM and splits had done to the tree
	 * before the read is noted instead.
	 */
	if (so->need_pins)
	{
		AmrKnnRead *rd;
		uint64		finished;

		if (so->nknn_reads == so->knn_reads_capacity)
		{
			so->knn_reads_capacity = Max(16, so->knn_reads_capacity * 2);
			so->knn_reads = scan_realloc(so->knn_reads,
										 sizeof(AmrKnnRead) * so->knn_reads_capacity,
										 so->scan_cxt);
		}
		read = so->nknn_reads++;
		rd = &so->knn_reads[read];
		rd->leaf_id = r->leaf_id;
		/* finished, then begun: equal only if no pass was under way between */
		finished = amr_removals_finished(t);
		rd->removals = amr_removals_begun(t);
		rd->quiet = rd->removals == finished;
		rd->nsn = amr_sync_read(&t->nsn);
	}
	img = amr_leaf_read_for_scan(scan->indexRelation, t, so->generation, r->leaf_id,
								 r->split_stamp, &so->readahead, so->leaf, NULL, NULL, &follow);
	if (img == NULL || img->hdr.tree_generation != so->generation)
	{
		check_tree_unchanged(scan);
		return;
	}
	check_no_resync(scan);
	if (follow != AMR_INVALID_LEAF)
		amr_knn_add_leaf(&so->knn, follow, r->distance, r->split_stamp);

	MemoryContextReset(so->eval_cxt);
	old_cxt = MemoryContextSwitchTo(so->eval_cxt);
	for (i = 0; i < (int) img->hdr.nentries; i++)
	{
		const AmrLeafEntry *en = &img->entries[i];
		AmrKnnHit  *hit;
		uint64		payload;
		double		distance;
		uint64		seq;
		bool		unused_recheck;

		if (en->flags & (AMR_ENTRY_FLAG_DEAD | AMR_ENTRY_FLAG_NULL))
			continue;
		/* ordered scans recheck whenever a key is lossy (so->recheck) */
		if (!entry_matches(scan, en, &unused_recheck))
			continue;
		payload = knn_new_hit(so);
		hit = &so->hits[payload];
		if (read >= 0)
			so->hit_read[payload] = (uint32) read;
		memcpy(&hit->tid, &en->tid_blk_hi, sizeof(ItemPointerData));
		hit->key = en->key;
		/* the heap TID identifies the entry: the tie order of the search */
		seq = ((uint64) ItemPointerGetBlockNumberNoCheck(&hit->tid) << 16) |
			ItemPointerGetOffsetNumberNoCheck(&hit->tid);
		if (so->order_fast != ORDER_FAST_NONE && !(en->flags & AMR_ENTRY_FLAG_NAN))
		{
			AmrPoint	q = {so->order_box.xlo, so->order_box.ylo};

			AmrPoint	k = {en->key.xlo, en->key.ylo};

			distance = so->order_fast == ORDER_FAST_BOX_POINT ?
				amr_box_point_axis_bound(&en->key, &q) :
				amr_point_point_axis_bound(&k, &q);
			amr_knn_add_entry_bound(&so->knn, distance, seq, payload);
			continue;
		}
		else if (so->order_exact)
			distance = DatumGetFloat8(FunctionCall2Coll(&ok->sk_func, ok->sk_collation,
														amr_key_value(scan->indexRelation,
																	  &en->key),
														ok->sk_argument));
		else
		{
			AmrFBox		fb = amr_fbox_from_box(&en->key);

			/* bounded as the search bounds nodes and leaves */
			distance = amr_knn_box_bound(&so->knn, &fb);
		}
		amr_knn_add_entry(&so->knn, distance, seq, payload, !so->order_exact);
	}
	MemoryContextSwitchTo(old_cxt);
}

/* Whether a leaf image still holds a hit's entry, alive. */
static bool
leaf_holds_hit(const AmrLeaf *img, const AmrKnnHit *hit)
{
	int			i;

	for (i = 0; i < (int) img->hdr.nentries; i++)
	{
		const AmrLeafEntry *en = &img->entries[i];

		if (!(en->flags & (AMR_ENTRY_FLAG_DEAD | AMR_ENTRY_FLAG_NULL)) &&
			memcmp(&en->tid_blk_hi, &hit->tid, sizeof(ItemPointerData)) == 0 &&
			memcmp(&en->key, &hit->key, sizeof(AmrBox)) == 0)
			return true;
	}
	return false;
}

/*
 * Pin, for the row an ordered scan that needs pins is about to return, a
 * leaf that holds the row's entry; the pin stays until the next row, while
 * the executor reads the visibility map for this one (amr_pins.c).
 *
 * The leaves the search read are not kept pinned while their entries wait
 * in its queue: an idle cursor would hold VACUUM at every one of them.  So
 * VACUUM may have removed the entry since its leaf was read.  If no removal
 * pass had begun on the tree since then (and none was under way) and the
 * leaf has not split, the entry is still in it, and the pin now, taken
 * before any later pass reaches the leaf, is as good as one taken before
 * the read.  Otherwise the leaf is read again under the pin, and the leaves
 * its splits since moved entries to, until one holds the entry.  False:
 * none does -- VACUUM removed it, so its row is dead to every snapshot,
 * this scan's included.
 */
static bool
knn_hold_returned(IndexScanDesc scan, uint64 payload)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTree    *t = so->tree;
	const AmrKnnRead *rd = &so->knn_reads[so->hit_read[payload]];
	const AmrKnnHit *hit = &so->hits[payload];
	uint32		leaf_id = rd->leaf_id;
	bool		unsplit;

	/* a resync moves entries with no NSN and no right link to follow */
	check_no_resync(scan);
	amr_pin_leaf(t, leaf_id);

	/*
	 * Under the leaf lock a split (which holds it exclusively) is either
	 * done, its new NSN visible, or not begun -- and then sees the pin (on a
	 * standby, amr_redo_note_split makes removals from the right half wait
	 * for it).
	 */
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_SHARED);
	unsplit = amr_store.leaves[leaf_id].nsn <= rd->nsn;
	LWLockRelease(amr_leaf_lock(leaf_id));
	if (rd->quiet && amr_removals_begun(t) == rd->removals && unsplit)
	{
		so->returned_leaf = leaf_id;
		return true;
	}
	for (;;)
	{
		const AmrLeaf *img;
		uint32		follow;

		CHECK_FOR_INTERRUPTS();
		img = amr_leaf_read_for_scan(scan->indexRelation, t, so->generation, leaf_id,
									 rd->nsn, &so->readahead, so->leaf, NULL, NULL,
									 &follow);
		if (img == NULL || img->hdr.tree_generation != so->generation)
		{
			amr_unpin_leaf(t, leaf_id);
			check_tree_unchanged(scan);
			return false;
		}
		check_no_resync(scan);
		if (leaf_holds_hit(img, hit))
		{
			so->returned_leaf = leaf_id;
			return true;
		}
		amr_unpin_leaf(t, leaf_id);
		if (follow == AMR_INVALID_LEAF)
			return false;
		leaf_id = follow;
		amr_pin_leaf(t, leaf_id);
	}
}

/*
 * The next entry of an ordered scan's box side, in ascending first
 * distance: its hit (payload) and distance; false when there is none.
 */
static bool
knn_pop(IndexScanDesc scan, uint64 *payload, double *distance)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	AmrTree    *t = so->tree;

	for (;;)
	{
		AmrKnnResult r;
		AmrKnnStep	step;
		bool		locked = amr_knn_next_reads_tree(&so->knn);

		CHECK_FOR_INTERRUPTS();
		if (locked)
			lock_tree_for_read(scan);
		step = amr_knn_next(&so->knn, &r);
		if (locked)
			LWLockRelease(amr_tree_lock(t));

		if (step == AMR_KNN_DONE)
			return false;
		if (step == AMR_KNN_LEAF)
		{
			knn_read_leaf(scan, &r);
			continue;
		}
		if (step == AMR_KNN_REFINE)
		{
			/* at the head under its bound: queue it under its distance */
			const AmrKnnHit *hit = &so->hits[r.payload];
			AmrPoint	q = {so->order_box.xlo, so->order_box.ylo};
			AmrPoint	k = {hit->key.xlo, hit->key.ylo};

			amr_knn_add_entry(&so->knn, so->order_fast == ORDER_FAST_BOX_POINT ?
							  amr_dist_box_point(&hit->key, &q) :
							  amr_dist_point_point(&k, &q),
							  r.seq, r.payload, false);
			continue;
		}
		*payload = r.payload;
		*distance = r.distance;
		return true;
	}
}

/* Equal as float8 ORDER BY compares them: NaN equals NaN. */
static inline bool
same_distance(double a, double b)
{
	return a == b || (isnan(a) && isnan(b));
}

/*
 * qsort_arg comparator of tie rows: the further distances as ORDER BY sorts
 * float8 (NaN after numbers, NULL after both), then the search's order.
 */
static int
tie_cmp(const void *a, const void *b, void *arg)
{
	AmrScanOpaque so = (AmrScanOpaque) arg;
	const AmrKnnTie *ta = (const AmrKnnTie *) a;
	const AmrKnnTie *tb = (const AmrKnnTie *) b;
	int			nvals = so->tie_width;
	int			i;

	for (i = 0; i < nvals; i++)
	{
		bool		na = so->tie_nulls[ta->row * nvals + i];
		bool		nb = so->tie_nulls[tb->row * nvals + i];
		int			c;

		if (na || nb)
		{
			if (na != nb)
				return na ? 1 : -1;
			continue;
		}
		c = float8_cmp_internal(so->tie_values[ta->row * nvals + i],
								so->tie_values[tb->row * nvals + i]);
		if (c != 0)
			return c;
	}
	return ta->row < tb->row ? -1 : ta->row > tb->row;
}

/*
 * More than one ORDER BY over exact keys: take every entry at the next
 * first distance (the search gives them consecutively, and keeps the one
 * after the group for next time), compute the further ORDER BYs' distances
 * with their operators, and sort the group by them.  False when the box
 * side has no entry left.
 */
static bool
knn_fill_ties(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	int			nvals = so->tie_width;
	uint64		payload;
	double		distance;
	double		first;
	MemoryContext old_cxt;
	int			n = 0;
	int			i;
	int			j;

	so->ntie = so->tie_pos = 0;
	if (so->have_ahead)
	{
		payload = so->ahead_payload;
		distance = so->ahead_distance;
		so->have_ahead = false;
	}
	else if (!knn_pop(scan, &payload, &distance))
		return false;
	first = distance;
	for (;;)
	{
		if (n == so->ties_capacity)
		{
			so->ties_capacity = Max(64, so->ties_capacity * 2);
			so->ties = scan_realloc(so->ties, sizeof(AmrKnnTie) * so->ties_capacity,
									so->scan_cxt);
			so->tie_values = scan_realloc(so->tie_values,
										  sizeof(double) * so->ties_capacity * nvals,
										  so->scan_cxt);
			so->tie_nulls = scan_realloc(so->tie_nulls,
										 sizeof(bool) * so->ties_capacity * nvals,
										 so->scan_cxt);
		}
		so->ties[n].payload = payload;
		so->ties[n].distance = distance;
		so->ties[n].row = n;
		n++;
		if (!knn_pop(scan, &payload, &distance))
			break;
		if (!same_distance(distance, first))
		{
			so->have_ahead = true;
			so->ahead_payload = payload;
			so->ahead_distance = distance;
			break;
		}
	}

	/*
	 * The operators may allocate: in eval_cxt, which nothing needs between
	 * leaf reads, reset per row (a NaN first argument ties every row).
	 */
	old_cxt = MemoryContextSwitchTo(so->eval_cxt);
	for (i = 0; i < n; i++)
	{
		const AmrKnnHit *hit = &so->hits[so->ties[i].payload];

		if ((i & 1023) == 1023)
			CHECK_FOR_INTERRUPTS();
		MemoryContextReset(so->eval_cxt);
		for (j = 0; j < nvals; j++)
		{
			ScanKey		ok = &scan->orderByData[so->order_key + 1 + j];
			int			k = i * nvals + j;

			so->tie_nulls[k] = (ok->sk_flags & SK_ISNULL) != 0;
			so->tie_values[k] = so->tie_nulls[k] ? 0 :
				DatumGetFloat8(FunctionCall2Coll(&ok->sk_func, ok->sk_collation,
												 amr_key_value(scan->indexRelation,
															   &hit->key),
												 ok->sk_argument));
		}
	}
	MemoryContextSwitchTo(old_cxt);
	if (n > 1)
		qsort_arg(so->ties, n, sizeof(AmrKnnTie), tie_cmp, so);
	so->ntie = n;
	return true;
}

/* The next row of an ordered scan's box side; false when there is none. */
static pg_noinline bool
knn_next(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;
	const AmrKnnHit *hit;
	uint64		payload;
	double		distance;
	int			i;

	/* the row returned last has been used (its visibility map bit read) */
	release_returned_leaf(so);

	for (;;)
	{
		if (!so->order_ties)
		{
			if (!knn_pop(scan, &payload, &distance))
				return false;
			for (i = so->order_key + 1; i < scan->numberOfOrderBys; i++)
			{
				scan->xs_orderbyvals[i] = Float8GetDatum(-get_float8_infinity());
				scan->xs_orderbynulls[i] = false;
			}
		}
		else
		{
			const AmrKnnTie *tie;
			int			nvals = so->tie_width;

			if (so->tie_pos >= so->ntie && !knn_fill_ties(scan))
				return false;
			tie = &so->ties[so->tie_pos++];
			payload = tie->payload;
			distance = tie->distance;
			for (i = 0; i < nvals; i++)
			{
				int			k = tie->row * nvals + i;

				scan->xs_orderbyvals[so->order_key + 1 + i] =
					Float8GetDatum(so->tie_values[k]);
				scan->xs_orderbynulls[so->order_key + 1 + i] = so->tie_nulls[k];
			}
		}
		if (!so->need_pins || knn_hold_returned(scan, payload))
			break;
		/* VACUUM removed it meanwhile: the next one */
		so->free_hits[so->nfree_hits++] = payload;
	}
	hit = &so->hits[payload];
	scan->xs_heaptid = hit->tid;
	scan->xs_recheck = so->recheck;
	for (i = 0; i < so->order_key; i++)
	{
		scan->xs_orderbyvals[i] = (Datum) 0;
		scan->xs_orderbynulls[i] = true;
	}
	scan->xs_orderbyvals[so->order_key] = Float8GetDatum(distance);
	scan->xs_orderbynulls[so->order_key] = false;
	scan->xs_recheckorderby = !so->order_exact;
	if (scan->xs_want_itup)
	{
		MemoryContextReset(so->batch_cxt);
		set_index_tuple(scan, &hit->key, false);
	}
	/* the row is out (TID and index tuple copied): its payload is free */
	so->free_hits[so->nfree_hits++] = payload;
	return true;
}

bool
amrgettuple(IndexScanDesc scan, ScanDirection dir)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;

	if (dir != ForwardScanDirection)
		elog(ERROR, "amrtree only supports forward scans");
	if (!so->started)
		start_scan(scan);

	if (so->ordered && !so->knn_box_done)
	{
		if (!so->no_match && so->want_box_side && knn_next(scan))
			return true;
		/* the box side is exhausted: the NULL side follows, if wanted */
		so->knn_box_done = true;
		if (so->no_match || !so->want_null_side)
			return false;
		collect_null_side(scan);
	}

	for (;;)
	{
		if (so->item_pos < so->nitems)
		{
			int			i = so->item_pos++;

			scan->xs_heaptid = so->tids[i];
			scan->xs_recheck = so->item_recheck[i];
			if (scan->numberOfOrderBys > 0)
				set_null_distances(scan);
			if (scan->xs_want_itup)
				set_index_tuple(scan, &so->boxes[i], so->isnull[i]);
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
		ItemPointerData recheck_tids[AMR_LEAF_CAPACITY];
		int			nexact = 0;
		int			nrecheck = 0;
		int			i;

		/* a page holding any row to recheck is rechecked whole by tidbitmap */
		for (i = 0; i < so->nitems; i++)
		{
			if (so->item_recheck[i])
				recheck_tids[nrecheck++] = so->tids[i];
			else
				so->tids[nexact++] = so->tids[i];
		}
		if (nexact > 0)
			tbm_add_tuples(tbm, so->tids, nexact, false);
		if (nrecheck > 0)
			tbm_add_tuples(tbm, recheck_tids, nrecheck, true);
		ntids += so->nitems;
	}
	return ntids;
}

void
amrendscan(IndexScanDesc scan)
{
	AmrScanOpaque so = (AmrScanOpaque) scan->opaque;

	release_batch(so);
	release_returned_leaf(so);
	MemoryContextDelete(so->batch_cxt);
	MemoryContextDelete(so->eval_cxt);
}
