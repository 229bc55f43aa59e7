/*-------------------------------------------------------------------------
 *
 * amr_build.c
 *		ambuild: bulk build by Sort-Tile-Recursive packing.
 *
 * The heap is scanned once (by parallel workers where the planner's rule
 * allows, see parallel_scan) into an in-memory array of rows -- or, for
 * more rows than maintenance_work_mem holds, into sorted runs on temporary
 * files merged back a slice at a time (amr_buildspill.c); the rows are
 * put in STR order (linear-time radix sorts) and cut into leaves
 * filled to the index's fillfactor (90% by default, as GiST's), which are
 * written sequentially to PMEM
 * slots with non-temporal stores and published in the Leaf Table one by one.
 * The inner levels are packed the same way from the leaf boxes.  The leaf
 * images are logged in batches of AMR_WAL_MAX_IMAGES, as GiST logs its
 * pages after a sorted build, and a last record tells replay to pack the
 * inner levels itself (amr_walredo.c); the inner nodes are never logged.
 *
 * The tree is created BUILDING inside the transaction; if the build fails or
 * the transaction aborts, everything published so far is freed by the abort
 * callback (amr_directory.c), and a crash mid-build is cleaned up by the
 * next reconciliation.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_build.h"
#include "amr_wal.h"

#include "access/parallel.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_proc.h"
#include "commands/progress.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/shm_mq.h"
#include "storage/smgr.h"
#include "tcop/tcopprot.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include <sys/mman.h>

#define AMR_BUILD_INNER_FILL	((AMR_INNER_FANOUT * 7) / 8)

#define AMR_PHASE_SCAN			2
#define AMR_PHASE_SORT			3
#define AMR_PHASE_WRITE_LEAVES	4
#define AMR_PHASE_INNER			5

/* Leaf images published but not yet logged (see build_log_add). */
typedef struct BuildLog
{
	bool		enabled;
	AmrTree    *t;
	int			n;
	uint32		ids[AMR_WAL_MAX_IMAGES];
	const AmrLeaf *imgs[AMR_WAL_MAX_IMAGES];
} BuildLog;

static void
build_log_flush(BuildLog *bl)
{
	if (bl->n > 0)
		(void) amr_wal_images(bl->t, AMR_IMAGE_BUILD, bl->n, bl->ids, bl->imgs, NULL);
	bl->n = 0;
}

/*
 * Log a published leaf, batched.  img must stay valid until the next flush:
 * the PMEM slot itself, or an SSD batch image (flush_batch flushes the log
 * before it reuses them).  Logging after publishing is safe for a BUILDING
 * tree: a crash in between drops the whole tree.
 */
static void
build_log_add(BuildLog *bl, uint32 leaf_id, const AmrLeaf *img)
{
	if (!bl->enabled)
		return;
	bl->ids[bl->n] = leaf_id;
	bl->imgs[bl->n] = img;
	if (++bl->n == AMR_WAL_MAX_IMAGES)
		build_log_flush(bl);
}

/*
 * What an operator class's bounding-box function allocates for a row (its
 * result, a detoasted value): kept apart and freed every ROWMEM_RESET_ROWS
 * rows, or a build would hold all of it to the end -- for 10M points, 380
 * MB; for PostGIS polygons, a deserialized geometry a row (docs/design.md,
 * build notes).  (The box operator class allocates nothing per row.)
 */
#define ROWMEM_RESET_ROWS	1024

typedef struct RowMemory
{
	MemoryContext cxt;
	int			rows;
} RowMemory;

static void
rowmem_init(RowMemory *rm)
{
	rm->cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree build rows",
									ALLOCSET_DEFAULT_SIZES);
	rm->rows = 0;
}

typedef struct AmrBuildState
{
	Relation	index;
	AmrBuildEntry *boxes;
	Size		nboxes;
	Size		capboxes;
	AmrBuildEntry *nulls;
	Size		nnulls;
	Size		capnulls;
	Size		mem;			/* maintenance_work_mem, in bytes */
	Size		max_rows;		/* rows kept in memory at most */
	int			fill;
	double		est_rows;		/* the planner's estimate of the rows, or -1 */
	AmrSpill   *spill;			/* sorted runs on disk, once max_rows came */
	RowMemory	rowmem;
} AmrBuildState;

char *
amrbuildphasename(int64 phasenum)
{
	switch (phasenum)
	{
		case PROGRESS_CREATEIDX_SUBPHASE_INITIALIZE:
			return "initializing";
		case AMR_PHASE_SCAN:
			return "scanning table";
		case AMR_PHASE_SORT:
			return "sorting keys";
		case AMR_PHASE_WRITE_LEAVES:
			return "writing leaves";
		case AMR_PHASE_INNER:
			return "building inner nodes";
		default:
			return NULL;
	}
}

/*
 * The build's big arrays (its rows, their packing order) are read in an
 * order unrelated to the one they were written in: with 4 kB pages nearly
 * every row a leaf gathers costs a TLB miss, and every 4 kB of a fresh
 * array a page fault.  Where the kernel gives transparent huge pages only
 * on request (Debian's "madvise"), ask for them: 2 MB pages put a 10M-row
 * build's 400 MB of rows within the TLB's reach.  Only the 2 MB-aligned
 * part of the allocation can be advised; below BUILD_HUGE_MIN it is not
 * worth a system call.  Advice only: on failure nothing changes.
 */
#define BUILD_HUGE_MIN		((Size) 32 << 20)
#define BUILD_HUGE_PAGE		((Size) 2 << 20)

static void
advise_huge_pages(void *p, Size len)
{
#ifdef MADV_HUGEPAGE
	uintptr_t	start = TYPEALIGN(BUILD_HUGE_PAGE, (uintptr_t) p);
	uintptr_t	end = TYPEALIGN_DOWN(BUILD_HUGE_PAGE, (uintptr_t) p + len);

	if (len >= BUILD_HUGE_MIN && end > start)
		(void) madvise((void *) start, end - start, MADV_HUGEPAGE);
#endif
}

/* MemoryContextAllocHuge in the current context, huge pages advised. */
static void *
build_alloc(Size len)
{
	void	   *p = MemoryContextAllocHuge(CurrentMemoryContext, len);

	advise_huge_pages(p, len);
	return p;
}

static AmrBuildEntry *
append_entry(AmrBuildEntry **arr, Size *n, Size *cap, Size limit)
{
	if (*n == *cap)
	{
		Size		newcap = Min(*cap ? *cap * 2 : 1024, limit);

		if (*arr == NULL)
			*arr = build_alloc(newcap * sizeof(AmrBuildEntry));
		else
		{
			*arr = repalloc_huge(*arr, newcap * sizeof(AmrBuildEntry));
			advise_huge_pages(*arr, newcap * sizeof(AmrBuildEntry));
		}
		*cap = newcap;
	}
	return &(*arr)[(*n)++];
}

/*
 * The rows collected so far to sorted runs on disk (amr_buildspill.c): as
 * many as maintenance_work_mem allows have come.  Called again for what is
 * left once the scan ends.
 */
static void
spill_collected(AmrBuildState *bs)
{
	if (bs->spill == NULL)
	{
		ereport(DEBUG1,
				(errmsg_internal("amrtree build of \"%s\": more than %zu rows, as many as maintenance_work_mem holds; sorting them in runs on disk",
								 RelationGetRelationName(bs->index), bs->max_rows)));
		bs->spill = amr_spill_begin(bs->max_rows, bs->fill, bs->mem);
	}
	amr_spill_add_rows(bs->spill, bs->boxes, bs->nboxes);
	amr_spill_add_nulls(bs->spill, bs->nulls, bs->nnulls);
	bs->nboxes = 0;
	bs->nnulls = 0;
}

/* Room for one more row on its side of the build: NULL keys or boxes. */
static inline AmrBuildEntry *
next_entry(AmrBuildState *bs, bool isnull)
{
	if (unlikely(bs->nboxes + bs->nnulls >= bs->max_rows))
		spill_collected(bs);
	return isnull ? append_entry(&bs->nulls, &bs->nnulls, &bs->capnulls, bs->max_rows) :
		append_entry(&bs->boxes, &bs->nboxes, &bs->capboxes, bs->max_rows);
}

/*
 * A row as the heap scan met it, into *e; what the bounding-box function
 * allocates goes into rm's context.
 */
static inline void
collect_row(AmrBuildEntry *e, Relation index, ItemPointer tid, Datum value, bool isnull,
			RowMemory *rm)
{
	if (isnull)
	{
		memset(&e->key, 0, sizeof(e->key));
		e->flags = AMR_ENTRY_FLAG_NULL;
	}
	else
	{
		MemoryContext old = MemoryContextSwitchTo(rm->cxt);

		amr_box_from_datum(index, value, &e->key);
		MemoryContextSwitchTo(old);
		e->flags = amr_box_has_nan(&e->key) ? AMR_ENTRY_FLAG_NAN : 0;
		if (++rm->rows == ROWMEM_RESET_ROWS)
		{
			MemoryContextReset(rm->cxt);
			rm->rows = 0;
		}
	}
	e->tid = *tid;
}

static void
build_callback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
			   bool tupleIsAlive, void *state)
{
	AmrBuildState *bs = (AmrBuildState *) state;

	collect_row(next_entry(bs, isnull[0]), index, tid, values[0], isnull[0], &bs->rowmem);
}

/* The leaf entry for a collected row. */
static inline void
set_leaf_entry(AmrLeafEntry *dst, const AmrBuildEntry *src, XLogRecPtr lsn)
{
	dst->key = src->key;
	dst->insert_lsn = lsn;
	memcpy(&dst->tid_blk_hi, &src->tid, sizeof(ItemPointerData));
	dst->flags = src->flags;
}

/*
 * The leaves' rows, leaf after leaf, into order[]; each leaf's in the
 * order the heap scan met them (refs number the rows so), so an index scan
 * fetches a leaf's rows block by block, and returns them in the order
 * GiST, which fills its leaves by insertion, tends to.  A counting pass
 * rather than a sort per leaf: each row is given its leaf's number, then
 * the rows, taken in scan order, are dealt to their leaves -- two linear
 * passes where sorting 75-row runs took a tenth of a 10M-row build.
 * order[] may be the memory of items[] (it needs a third of it): each item
 * is read before any row is dealt.  leaf_of[] is room for n numbers, the
 * sort's scratch space reused (fresh memory is what a build pays most for).
 */
static void
order_leaves_by_heap(const AmrPackPoint *items, Size n, const size_t *bounds,
					 size_t nclasses, int fill, Size nleaves, uint32 *leaf_of,
					 uint32 *order)
{
	uint32	   *next = MemoryContextAllocHuge(CurrentMemoryContext,
											  sizeof(uint32) * (nleaves + 1));
	uint32		leaf = 0;
	size_t		c;
	Size		i;

	for (c = 0; c < nclasses; c++)
	{
		Size		first;

		for (first = bounds[c]; first < bounds[c + 1]; first += fill)
		{
			Size		end = Min(first + (Size) fill, bounds[c + 1]);

			next[leaf] = (uint32) first;
			for (i = first; i < end; i++)
				leaf_of[items[i].ref] = leaf;
			leaf++;
		}
	}
	Assert(leaf == nleaves);
	for (i = 0; i < n; i++)
		order[next[leaf_of[i]]++] = (uint32) i;
	pfree(next);
}

/* Reserve a leaf id and a slot, on *tier or else the other tier (*tier says which). */
static void
reserve_leaf(Relation index, uint32 *tier, uint32 *leaf_id, uint32 *slot)
{
	*leaf_id = amr_take_leaf_id(index);
	PG_TRY();
	{
		amr_take_slot(index, AMR_SLOT_ADDS, *tier, tier, slot);
	}
	PG_CATCH();
	{
		amr_bitmap_clear(amr_store.leaf_ids_used, *leaf_id);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

#define SSD_BATCH 64

/* SSD images prepared, then written together, synced, and published */
typedef struct SsdBatch
{
	int			n;
	AmrLeaf    *images;			/* SSD_BATCH aligned images */
	uint32		leaf_id[SSD_BATCH];
	uint32		slot[SSD_BATCH];
	AmrFBox		mbr[SSD_BATCH];
} SsdBatch;

static void
publish_leaf(AmrTree *t, uint32 leaf_id, uint32 tier, uint32 slot, const AmrLeaf *img,
			 const AmrFBox *mbr, bool nulls, AmrPackItem *item)
{
	amr_leaf_publish(t, leaf_id, tier, slot, img, mbr, nulls);
	if (nulls)
		memset(&item->box, 0, sizeof(item->box));
	else
		item->box = *mbr;
	item->ref = leaf_id;
	amr_counter_add(&t->nleaves, 1);
	amr_counter_add(&t->nentries, img->hdr.nentries);
}

/* Make the batch durable with one sync, then publish and log it. */
static void
flush_batch(Relation index, AmrTree *t, SsdBatch *b, bool nulls,
			AmrPackItem *leaf_items, Size *nleaves, BuildLog *bl)
{
	AmrLeaf    *imgs[SSD_BATCH];
	int			i;

	if (b->n == 0)
		return;
	for (i = 0; i < b->n; i++)
		imgs[i] = &b->images[i];
	AMR_FAULT_POINT("build:before_leaf");
	amr_leaf_write_ssd_batch(index, b->slot, imgs, b->n);
	AMR_FAULT_POINT("build:after_leaf_persisted");
	for (i = 0; i < b->n; i++)
	{
		publish_leaf(t, b->leaf_id[i], AMR_TIER_SSD, b->slot[i], &b->images[i],
					 &b->mbr[i], nulls, &leaf_items[(*nleaves)++]);
		AMR_FAULT_POINT("build:after_leaf_published");
		build_log_add(bl, b->leaf_id[i], &b->images[i]);
	}
	build_log_flush(bl);
	b->n = 0;
}

static void
release_batch(SsdBatch *b)
{
	int			i;

	for (i = 0; i < b->n; i++)
	{
		amr_bitmap_clear(amr_store.leaf_ids_used, b->leaf_id[i]);
		amr_give_back_slot(AMR_TIER_SSD, b->slot[i]);
	}
	b->n = 0;
}

double
amr_build_class_base(const AmrBuildEntry *rows, Size n)
{
	double		sample[1024];
	int			nsample = 0;
	Size		step = n / 1024 + 1;
	Size		i;

	for (i = 0; i < n && nsample < 1024; i += step)
	{
		AmrFBox		fb = amr_fbox_from_box(&rows[i].key);

		sample[nsample++] = amr_pack_extent(&fb);
	}
	return amr_pack_class_base(sample, nsample);
}

void
amr_build_points(const AmrBuildEntry *rows, Size n, double base,
				 AmrPackPoint *items, uint8 *cls)
{
	Size		i;

	for (i = 0; i < n; i++)
	{
		AmrFBox		fb = amr_fbox_from_box(&rows[i].key);

		items[i] = amr_pack_point(&fb, (uint32) i);
		cls[i] = (uint8) amr_pack_size_class(&fb, base);
	}
}

/*
 * The leaf level's packing order (amr_pack_order's: size classes, STR in
 * each) of the collected rows, as point items of 12 bytes: the sort needs
 * only the centres, the classes are computed here, once, and the leaves'
 * boxes later from the entries themselves.  scratch[] is room for n items.
 * Returns the number of classes.
 */
static size_t
pack_order(const AmrBuildEntry *entries, Size n, int fill, AmrPackPoint *items,
		   AmrPackPoint *scratch, size_t *bounds)
{
	uint8	   *cls = build_alloc(n + 1);
	size_t		nclasses;

	amr_build_points(entries, n, amr_build_class_base(entries, n), items, cls);
	nclasses = amr_pack_points_order(items, cls, n, (size_t) fill, scratch, bounds);
	pfree(cls);
	return nclasses;
}

/*
 * Writing one side's leaves (boxes or NULL keys), in packing order: PMEM
 * images in place, SSD images in batches of SSD_BATCH; each published and
 * logged, its box and id kept for the inner levels.
 */
typedef struct LeafWriter
{
	Relation	index;
	AmrTree    *t;
	bool		nulls;
	XLogRecPtr	lsn;
	BuildLog   *bl;
	Size	   *done;			/* rows written, for progress */
	AmrLeaf    *img;
	SsdBatch	batch;
	AmrPackItem *leaf_items;	/* the written leaves' boxes and ids */
	Size		nleaves;
	Size		remaining;		/* leaves still to write */
	bool		locked;			/* publish lock held */
} LeafWriter;

static void
leaf_writer_begin(LeafWriter *w, Relation index, AmrTree *t, bool nulls, XLogRecPtr lsn,
				  Size nleaves, Size *done, BuildLog *bl)
{
	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, AMR_PHASE_WRITE_LEAVES);
	memset(w, 0, sizeof(*w));
	w->index = index;
	w->t = t;
	w->nulls = nulls;
	w->lsn = lsn;
	w->bl = bl;
	w->done = done;
	w->img = amr_alloc_leaf_buffer();
	w->batch.images = (AmrLeaf *) TYPEALIGN(AMR_SLOT_SIZE,
											palloc((SSD_BATCH + 1) * AMR_SLOT_SIZE));
	w->leaf_items = MemoryContextAllocHuge(CurrentMemoryContext,
										   sizeof(AmrPackItem) * (nleaves + 1));
	w->remaining = nleaves;

	/*
	 * One msync for every PMEM image and Leaf Table entry of the build where
	 * the pool is a disk file, instead of three per leaf: the tree is
	 * BUILDING, so a crash before the end discards it whatever reached the
	 * file, and the batch ends before the build returns, so before its
	 * transaction can commit (docs/design.md, "Commit points").
	 */
	amr_persist_batch_begin();
}

/*
 * Write the leaf of rows[idx[0..take-1]] (rows[0..take-1] where idx is
 * NULL), in that order.  The rows of the next leaf, rows[next[0..nnext-1]],
 * are fetched meanwhile: their cache misses (and TLB misses) overlap this
 * leaf's copy instead of following it.
 */
static void
leaf_writer_add(LeafWriter *w, const AmrBuildEntry *rows, const uint32 *idx, Size take,
				const uint32 *next, Size nnext)
{
	AmrStore   *s = &amr_store;
	uint32		leaf_id;
	uint32		slot;
	uint32		tier;
	AmrFBox		mbr;
	AmrLeaf    *dst;
	Size		i;

	if (!w->locked)
	{
		CHECK_FOR_INTERRUPTS();
		LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
		w->locked = true;
	}
	/* PMEM while within the budget (if any), the rest to SSD */
	tier = amr_tree_new_image_tier(w->t, 1, w->remaining--);
	reserve_leaf(w->index, &tier, &leaf_id, &slot);
	dst = tier == AMR_TIER_SSD ? &w->batch.images[w->batch.n] : w->img;
	amr_leaf_image_init(dst, leaf_id, w->t->tree_no, w->t->generation,
						AMR_WORD_VERSION(amr_lt_word(s, leaf_id)) + 1, w->nulls);

	for (i = 0; i < nnext; i++)
		amr_build_prefetch(&rows[next[i]]);

	/* the leaf's box: the union of its entries' (outward-rounded) boxes */
	mbr = amr_fbox_empty();
	for (i = 0; i < take; i++)
	{
		const AmrBuildEntry *e = &rows[idx ? idx[i] : i];

		set_leaf_entry(&dst->entries[i], e, w->lsn);
		if (!w->nulls)
		{
			AmrFBox		fb = amr_fbox_from_box(&e->key);

			amr_fbox_extend(&mbr, &fb);
		}
	}
	dst->hdr.nentries = take;

	if (tier == AMR_TIER_PMEM)
	{
		AMR_FAULT_POINT("build:before_leaf");
		amr_leaf_write_image(w->index, tier, slot, dst);
		AMR_FAULT_POINT("build:after_leaf_persisted");
		publish_leaf(w->t, leaf_id, tier, slot, dst, &mbr, w->nulls,
					 &w->leaf_items[w->nleaves++]);
		AMR_FAULT_POINT("build:after_leaf_published");
		build_log_add(w->bl, leaf_id, amr_pmem_slot(s, slot));
	}
	else
	{
		w->batch.leaf_id[w->batch.n] = leaf_id;
		w->batch.slot[w->batch.n] = slot;
		w->batch.mbr[w->batch.n] = mbr;
		w->batch.n++;
		if (w->batch.n == SSD_BATCH)
			flush_batch(w->index, w->t, &w->batch, w->nulls, w->leaf_items, &w->nleaves,
						w->bl);
	}
	*w->done += take;
	if (w->batch.n == 0)
	{
		LWLockRelease(&amr_shared->publish_lock);
		w->locked = false;
	}
	if ((w->nleaves & 63) == 0)
		pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE, (int64) *w->done);
}

/* Every leaf written: the last SSD batch, the persist batch, the log. */
static void
leaf_writer_finish(LeafWriter *w)
{
	if (w->batch.n > 0)
		flush_batch(w->index, w->t, &w->batch, w->nulls, w->leaf_items, &w->nleaves, w->bl);
	amr_persist_batch_end();
	build_log_flush(w->bl);
	if (w->locked)
	{
		LWLockRelease(&amr_shared->publish_lock);
		w->locked = false;
	}
	pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE, (int64) *w->done);
}

/*
 * On error: what the batch reserved goes back; the published leaves go
 * with the tree when the transaction aborts.
 */
static void
leaf_writer_abort(LeafWriter *w)
{
	amr_persist_batch_end();
	release_batch(&w->batch);
}

/* The inner levels over the written leaves. */
static void
leaf_writer_build_inner(LeafWriter *w)
{
	AmrStore   *s = &amr_store;
	AmrPackItem *level_scratch;
	uint32	   *node_ids;
	AmrStatus	st;

	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, AMR_PHASE_INNER);
	level_scratch = MemoryContextAllocHuge(CurrentMemoryContext,
										   sizeof(AmrPackItem) * (w->nleaves + 1));
	node_ids = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(uint32) *
									  (amr_build_levels_nodes_needed(w->nleaves, AMR_BUILD_INNER_FILL) + 1));
	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	LWLockAcquire(amr_tree_lock(w->t), LW_EXCLUSIVE);
	st = amr_build_levels(s, w->t, w->nulls, w->leaf_items, w->nleaves, AMR_BUILD_INNER_FILL,
						  level_scratch, node_ids);
	LWLockRelease(amr_tree_lock(w->t));
	LWLockRelease(&amr_shared->publish_lock);
	amr_report_status(st, w->index);

	pfree(level_scratch);
	pfree(w->leaf_items);
	pfree(node_ids);
}

/* One side of a build whose rows are all in memory: entries[0..n-1]. */
static void
build_side(Relation index, AmrTree *t, AmrBuildEntry *entries, Size n,
		   bool nulls, XLogRecPtr lsn, Size *done, BuildLog *bl)
{
	int			fill = amr_build_leaf_fill(index);
	AmrPackPoint *items;
	AmrPackPoint *scratch = NULL;
	uint32	   *order;
	LeafWriter	w;
	size_t		bounds[AMR_SIZE_CLASSES + 1];
	size_t		nclasses;
	size_t		c;
	Size		remaining = 0;
	Size		i;

	items = build_alloc(sizeof(AmrPackPoint) * (n + 1));
	order = (uint32 *) items;
	if (nulls)
	{
		/* NULL keys have no position: any grouping will do */
		for (i = 0; i < n; i++)
			order[i] = (uint32) i;
		bounds[0] = 0;
		bounds[1] = n;
		nclasses = n > 0 ? 1 : 0;
	}
	else
	{
		pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, AMR_PHASE_SORT);
		scratch = build_alloc(sizeof(AmrPackPoint) * (n + 1));
		nclasses = pack_order(entries, n, fill, items, scratch, bounds);
	}
	for (c = 0; c < nclasses; c++)
		remaining += (bounds[c + 1] - bounds[c] + fill - 1) / fill;
	if (!nulls)
	{
		order_leaves_by_heap(items, n, bounds, nclasses, fill, remaining,
							 (uint32 *) scratch, order);
		pfree(scratch);
	}

	leaf_writer_begin(&w, index, t, nulls, lsn, remaining, done, bl);
	PG_TRY();
	{
		for (c = 0; c < nclasses; c++)
		{
			Size		first;

			for (first = bounds[c]; first < bounds[c + 1]; first += fill)
			{
				Size		take = Min((Size) fill, bounds[c + 1] - first);

				leaf_writer_add(&w, entries, order + first, take, order + first + take,
								Min((Size) fill, n - (first + take)));
			}
		}
		leaf_writer_finish(&w);
	}
	PG_CATCH();
	{
		leaf_writer_abort(&w);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(items);
	leaf_writer_build_inner(&w);
}

/*
 * One side of a build whose rows went to sorted runs on disk: the boxes a
 * slice at a time as the runs merge (amr_buildspill.c), the NULL keys in
 * scan order.  Every slice but a size class's last holds whole leaves, so
 * the leaves are those a build in memory cuts.
 */
static void
build_side_spilled(Relation index, AmrTree *t, AmrSpill *sp, bool nulls,
				   XLogRecPtr lsn, Size *done, BuildLog *bl)
{
	Size		fill = (Size) amr_build_leaf_fill(index);
	AmrBuildEntry *buf = palloc(sizeof(AmrBuildEntry) * fill);
	LeafWriter	w;

	leaf_writer_begin(&w, index, t, nulls, lsn, amr_spill_leaves(sp, nulls), done, bl);
	PG_TRY();
	{
		AmrBuildEntry *rows;
		Size		n;

		if (nulls)
		{
			while ((n = amr_spill_next_nulls(sp, buf, fill)) > 0)
				leaf_writer_add(&w, buf, NULL, n, NULL, 0);
		}
		else
		{
			while ((n = amr_spill_next_slice(sp, &rows)) > 0)
			{
				Size		first;

				for (first = 0; first < n; first += fill)
					leaf_writer_add(&w, rows + first, NULL, Min(fill, n - first), NULL, 0);
			}
		}
		leaf_writer_finish(&w);
	}
	PG_CATCH();
	{
		leaf_writer_abort(&w);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(buf);
	leaf_writer_build_inner(&w);
}

/* ---- a parallel heap scan ---- */

/*
 * With max_parallel_maintenance_workers > 0 and a table big enough for the
 * planner's rule (plan_create_index_workers, as for btree), parallel
 * workers scan the heap and stream the collected rows to the leader
 * through one message queue each; the leader only receives, packs and
 * writes.  Why: the heap scan (visibility, forming the index datum) was
 * half of a 10M-row build, and on the leader's CPU alone; received rows go
 * straight into the leader's array, whose page faults then overlap the
 * workers' scanning.  Concurrent builds (CREATE INDEX CONCURRENTLY, which
 * scans with an MVCC snapshot) stay serial.
 *
 * When the planner expects more rows than maintenance_work_mem holds, the
 * rows would go to sorted runs anyway (amr_buildspill.c), and streaming
 * them would leave the workers waiting on full queues while the leader
 * sorts each chunk.  Then every participant, the leader included, scans
 * blocks and sorts runs of its own in an equal share of the memory (the
 * workers' in a shared file set), and the leader merges them all.
 */
#define AMR_PKEY_SHARED		UINT64CONST(0xA3B7000000000001)
#define AMR_PKEY_QUEUES		UINT64CONST(0xA3B7000000000002)
#define AMR_PKEY_QUERY_TEXT	UINT64CONST(0xA3B7000000000003)
#define AMR_PQUEUE_SIZE		((Size) 1 << 20)
#define AMR_PBATCH_ROWS		1024	/* rows a message carries at most */

typedef struct AmrParallelShared
{
	Oid			heaprelid;
	Oid			indexrelid;
	slock_t		mutex;
	double		reltuples;		/* summed by the workers */
	bool		broken_hot_chain;
	/* sort_runs: the workers sort runs of chunk_rows rows (see parallel_scan) */
	bool		sort_runs;
	Size		chunk_rows;
	int			fill;
	AmrSpillShared spill;
	/* ParallelTableScanDescData follows, MAXALIGNed */
} AmrParallelShared;

#define AmrParallelScan(shared) \
	((ParallelTableScanDesc) ((char *) (shared) + MAXALIGN(sizeof(AmrParallelShared))))

typedef struct AmrWorkerState
{
	shm_mq_handle *mqh;
	RowMemory	rowmem;
	int			n;
	AmrBuildEntry rows[AMR_PBATCH_ROWS];
} AmrWorkerState;

PGDLLEXPORT void amr_parallel_build_main(dsm_segment *seg, shm_toc *toc);

static void
worker_flush(AmrWorkerState *ws)
{
	if (ws->n == 0)
		return;
	if (shm_mq_send(ws->mqh, ws->n * sizeof(AmrBuildEntry), ws->rows, false, true) != SHM_MQ_SUCCESS)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("amrtree build: the leader stopped receiving rows")));
	ws->n = 0;
}

static void
worker_callback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
				bool tupleIsAlive, void *state)
{
	AmrWorkerState *ws = (AmrWorkerState *) state;

	collect_row(&ws->rows[ws->n], index, tid, values[0], isnull[0], &ws->rowmem);
	if (++ws->n == AMR_PBATCH_ROWS)
		worker_flush(ws);
}

/* A parallel worker's part of a build: scan blocks, send rows. */
void
amr_parallel_build_main(dsm_segment *seg, shm_toc *toc)
{
	AmrParallelShared *shared = shm_toc_lookup(toc, AMR_PKEY_SHARED, false);
	char	   *queues = shm_toc_lookup(toc, AMR_PKEY_QUEUES, false);
	char	   *query_text = shm_toc_lookup(toc, AMR_PKEY_QUERY_TEXT, true);
	shm_mq	   *mq = (shm_mq *) (queues + ParallelWorkerNumber * AMR_PQUEUE_SIZE);
	AmrWorkerState *ws = palloc(sizeof(AmrWorkerState));
	Relation	heap;
	Relation	index;
	IndexInfo  *indexInfo;
	TableScanDesc scan;
	double		reltuples;

	/*
	 * The leader's statement, for pg_stat_activity and error reports: without
	 * it the workers show an empty query while they scan.
	 */
	if (query_text != NULL)
	{
		debug_query_string = query_text;
		pgstat_report_activity(STATE_RUNNING, query_text);
	}

	/* the leader holds these locks already: this is its lock group */
	heap = table_open(shared->heaprelid, ShareLock);
	index = index_open(shared->indexrelid, AccessExclusiveLock);
	indexInfo = BuildIndexInfo(index);
	shm_mq_set_sender(mq, MyProc);
	ws->mqh = shm_mq_attach(mq, seg, NULL);
	scan = table_beginscan_parallel(heap, AmrParallelScan(shared));
	if (shared->sort_runs)
	{
		/* rows to runs of this worker's own, as a serial build's spill */
		AmrBuildState bs;

		memset(&bs, 0, sizeof(bs));
		bs.index = index;
		bs.fill = shared->fill;
		bs.max_rows = shared->chunk_rows;
		bs.est_rows = -1;
		bs.spill = amr_spill_begin_worker(shared->chunk_rows, shared->fill, &shared->spill,
										  ParallelWorkerNumber);
		rowmem_init(&bs.rowmem);
		reltuples = table_index_build_scan(heap, index, indexInfo, true, false,
										   build_callback, (void *) &bs, scan);
		spill_collected(&bs);
		amr_spill_worker_done(bs.spill);
	}
	else
	{
		rowmem_init(&ws->rowmem);
		ws->n = 0;
		reltuples = table_index_build_scan(heap, index, indexInfo, true, false,
										   worker_callback, (void *) ws, scan);
		worker_flush(ws);
	}
	SpinLockAcquire(&shared->mutex);
	shared->reltuples += reltuples;
	shared->broken_hot_chain |= indexInfo->ii_BrokenHotChain;
	SpinLockRelease(&shared->mutex);
	shm_mq_detach(ws->mqh);
	index_close(index, AccessExclusiveLock);
	table_close(heap, ShareLock);
}

/*
 * Scan the heap with parallel workers into bs; returns false (having done
 * nothing) where the build should scan alone: no workers planned or none
 * could be started.
 */
static bool
parallel_scan(Relation heap, Relation index, IndexInfo *indexInfo,
			  AmrBuildState *bs, double *reltuples)
{
	int			nworkers;
	ParallelContext *pcxt;
	AmrParallelShared *shared;
	char	   *queues;
	shm_mq_handle **mqh;
	Size		scan_size;
	Size		query_size;		/* the statement for the workers, with its NUL */
	ParallelBlockTableScanDesc blocks = NULL;
	int			nlaunched;
	int			nlive;
	int			i;
	double		leader_tuples = 0;

	if (indexInfo->ii_Concurrent || IsInParallelMode() ||
		RelationUsesLocalBuffers(heap))
		return false;
	/* the workers call the opclass's bounding-box function: it must allow it */
	if (!amr_opclass_exact(index))
	{
		Oid			bbox_proc = index_getprocid(index, 1, AMR_BBOX_PROC);

		if (OidIsValid(bbox_proc) && func_parallel(bbox_proc) != PROPARALLEL_SAFE)
			return false;
	}
	nworkers = plan_create_index_workers(RelationGetRelid(heap), RelationGetRelid(index));
	if (nworkers <= 0)
		return false;

	EnterParallelMode();
	pcxt = CreateParallelContext("amrtree", "amr_parallel_build_main", nworkers);
	scan_size = table_parallelscan_estimate(heap, SnapshotAny);
	shm_toc_estimate_chunk(&pcxt->estimator,
						   add_size(MAXALIGN(sizeof(AmrParallelShared)), scan_size));
	shm_toc_estimate_chunk(&pcxt->estimator, mul_size(AMR_PQUEUE_SIZE, nworkers));
	shm_toc_estimate_keys(&pcxt->estimator, 2);
	/* a background worker (the rebuild of a lost index) may have none */
	query_size = debug_query_string ? strlen(debug_query_string) + 1 : 0;
	if (query_size > 0)
	{
		shm_toc_estimate_chunk(&pcxt->estimator, query_size);
		shm_toc_estimate_keys(&pcxt->estimator, 1);
	}
	InitializeParallelDSM(pcxt);
	if (pcxt->seg == NULL)
	{
		/* no dynamic shared memory to be had */
		DestroyParallelContext(pcxt);
		ExitParallelMode();
		return false;
	}
	shared = shm_toc_allocate(pcxt->toc, add_size(MAXALIGN(sizeof(AmrParallelShared)), scan_size));
	shared->heaprelid = RelationGetRelid(heap);
	shared->indexrelid = RelationGetRelid(index);
	SpinLockInit(&shared->mutex);
	shared->reltuples = 0;
	shared->broken_hot_chain = false;
	shared->fill = bs->fill;
	shared->sort_runs = false;
	shared->chunk_rows = 0;

	/*
	 * More rows expected than maintenance_work_mem holds: then every
	 * participant, the leader too, scans and sorts runs of its own, in an
	 * equal share of the memory, rather than the workers waiting on full
	 * queues while the leader sorts each chunk alone (btree's parallel sort
	 * is built the same way).  An estimate that proves low costs nothing
	 * worse: the leader then spills as a serial build does.
	 */
	if (bs->est_rows > (double) bs->max_rows)
	{
		Size		chunk_rows = Max(bs->max_rows / (nworkers + 1), 1024);

		bs->spill = amr_spill_begin_parallel(chunk_rows, bs->fill, bs->mem, &shared->spill);
		if (bs->spill)
		{
			shared->sort_runs = true;
			shared->chunk_rows = chunk_rows;
		}
	}
	table_parallelscan_initialize(heap, AmrParallelScan(shared), SnapshotAny);
	shm_toc_insert(pcxt->toc, AMR_PKEY_SHARED, shared);
	queues = shm_toc_allocate(pcxt->toc, mul_size(AMR_PQUEUE_SIZE, nworkers));
	shm_toc_insert(pcxt->toc, AMR_PKEY_QUEUES, queues);
	if (query_size > 0)
	{
		char	   *query_text = shm_toc_allocate(pcxt->toc, query_size);

		memcpy(query_text, debug_query_string, query_size);
		shm_toc_insert(pcxt->toc, AMR_PKEY_QUERY_TEXT, query_text);
	}
	for (i = 0; i < nworkers; i++)
	{
		shm_mq	   *mq = shm_mq_create(queues + i * AMR_PQUEUE_SIZE, AMR_PQUEUE_SIZE);

		shm_mq_set_receiver(mq, MyProc);
	}

	LaunchParallelWorkers(pcxt);
	nlaunched = pcxt->nworkers_launched;
	if (nlaunched == 0)
	{
		WaitForParallelWorkersToFinish(pcxt);
		if (bs->spill)
		{
			amr_spill_end(bs->spill);
			bs->spill = NULL;
		}
		DestroyParallelContext(pcxt);
		ExitParallelMode();
		return false;
	}
	if (shared->sort_runs)
		ereport(DEBUG1,
				(errmsg_internal("amrtree build of \"%s\": about %.0f rows, more than maintenance_work_mem holds; the leader and %d parallel workers scan the table and sort runs of up to %zu rows each",
								 RelationGetRelationName(index), bs->est_rows, nlaunched,
								 shared->chunk_rows)));
	else
		ereport(DEBUG1,
				(errmsg_internal("amrtree build of \"%s\": %d parallel workers scan the table",
								 RelationGetRelationName(index), nlaunched)));

	/*
	 * Progress in blocks, as a serial scan reports it: for a block-based
	 * table AM (heap), the blocks handed out to the workers so far.
	 */
	if (heap->rd_tableam->parallelscan_initialize == table_block_parallelscan_initialize)
	{
		blocks = (ParallelBlockTableScanDesc) AmrParallelScan(shared);
		pgstat_progress_update_param(PROGRESS_SCAN_BLOCKS_TOTAL, blocks->phs_nblocks);
	}
	mqh = palloc0(sizeof(shm_mq_handle *) * nlaunched);
	for (i = 0; i < nlaunched; i++)
		mqh[i] = shm_mq_attach((shm_mq *) (queues + i * AMR_PQUEUE_SIZE), pcxt->seg,
							   pcxt->worker[i].bgwhandle);

	/*
	 * Sorting runs, the leader takes its share of the blocks as a worker does
	 * (its queues stay empty); its rows go to its own runs.
	 */
	if (shared->sort_runs)
	{
		TableScanDesc scan;

		bs->max_rows = shared->chunk_rows;
		if (bs->capboxes > bs->max_rows)
		{
			/* sized for the whole table, and not yet touched */
			pfree(bs->boxes);
			bs->boxes = NULL;
			bs->capboxes = 0;
		}
		scan = table_beginscan_parallel(heap, AmrParallelScan(shared));
		leader_tuples = table_index_build_scan(heap, index, indexInfo, true, true,
											   build_callback, (void *) bs, scan);
	}

	/* receive until every worker has detached (finished or failed) */
	nlive = nlaunched;
	while (nlive > 0)
	{
		bool		got = false;

		for (i = 0; i < nlaunched; i++)
		{
			Size		nbytes;
			void	   *data;
			shm_mq_result res;
			const AmrBuildEntry *rows;
			Size		nrows;
			Size		r;

			if (mqh[i] == NULL)
				continue;
			res = shm_mq_receive(mqh[i], &nbytes, &data, true);
			if (res == SHM_MQ_WOULD_BLOCK)
				continue;
			if (res == SHM_MQ_DETACHED)
			{
				mqh[i] = NULL;
				nlive--;
				continue;
			}
			got = true;
			rows = (const AmrBuildEntry *) data;
			nrows = nbytes / sizeof(AmrBuildEntry);
			for (r = 0; r < nrows; r++)
				*next_entry(bs, (rows[r].flags & AMR_ENTRY_FLAG_NULL) != 0) = rows[r];
		}
		if (got && blocks != NULL)
			pgstat_progress_update_param(PROGRESS_SCAN_BLOCKS_DONE,
										 Min(pg_atomic_read_u64(&blocks->phs_nallocated),
											 (uint64) blocks->phs_nblocks));
		if (!got && nlive > 0)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH, -1,
							 PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
		CHECK_FOR_INTERRUPTS();
	}

	/* a worker's error is raised here */
	WaitForParallelWorkersToFinish(pcxt);
	if (shared->sort_runs)
		amr_spill_take_workers(bs->spill, nlaunched);
	*reltuples = shared->reltuples + leader_tuples;
	if (shared->broken_hot_chain)
		indexInfo->ii_BrokenHotChain = true;
	DestroyParallelContext(pcxt);
	ExitParallelMode();
	return true;
}

IndexBuildResult *
amrbuild(Relation heap, Relation index, struct IndexInfo *indexInfo)
{
	IndexBuildResult *result;
	AmrBuildState bs;
	double		reltuples;
	uint32		tree_no;
	AmrTree    *t;
	XLogRecPtr	lsn;
	Size		done = 0;
	Size		nrows;
	bool		unlogged = index->rd_rel->relpersistence == RELPERSISTENCE_UNLOGGED;
	BuildLog	bl;

	amr_require_ready();
	if (RelationGetNumberOfBlocks(index) != 0)
		elog(ERROR, "index \"%s\" already contains data", RelationGetRelationName(index));

	/*
	 * pg_upgrade restores the schema into the new cluster, then puts the old
	 * cluster's relation files -- this metapage included -- in place of the
	 * new ones under the same relfilenode.  A tree built here would be empty,
	 * yet found by that storage identity (see find_tree_of), and the index
	 * would return no rows.  So build none: the upgraded index has no tree in
	 * this pool and is rebuilt once the new server runs (docs/design.md,
	 * "pg_upgrade").
	 */
	if (IsBinaryUpgrade)
	{
		amr_metapage_write(index, MAIN_FORKNUM, AMR_NO_TREE);
		result = (IndexBuildResult *) palloc0(sizeof(IndexBuildResult));
		return result;
	}

	tree_no = amr_tree_create(index, unlogged);
	t = &amr_store.trees[tree_no];
	AMR_FAULT_POINT("build:after_tree_created");

	memset(&bs, 0, sizeof(bs));
	bs.index = index;
	bs.fill = amr_build_leaf_fill(index);
	bs.mem = (Size) maintenance_work_mem * 1024;
	bs.max_rows = Max(bs.mem / AMR_BUILD_BYTES_PER_ROW, 1024);
	bs.est_rows = -1;
	rowmem_init(&bs.rowmem);

	/*
	 * Room for the rows the table is expected to hold (and a little more), so
	 * a big build does not copy its entries at every doubling: at 10M rows
	 * that was a gigabyte of copies and fresh pages.  The planner's estimate,
	 * not reltuples: a table loaded and indexed before any VACUUM or ANALYZE
	 * (reltuples = -1) is estimated from its size and row width, and one that
	 * grew since is scaled to its current size.  Not for a partial index,
	 * which may take a small part of the rows: room for all of them could
	 * exceed what the machine would grant.  At most what maintenance_work_mem
	 * holds: more rows than that go to sorted runs on disk.
	 */
	if (indexInfo->ii_Predicate == NIL)
	{
		BlockNumber pages;
		double		tuples;
		double		allvisfrac;

		table_relation_estimate_size(heap, NULL, &pages, &tuples, &allvisfrac);
		bs.est_rows = tuples;
		if (tuples > 0)
		{
			bs.capboxes = Min(Min((Size) (tuples * 1.05) + 1024, bs.max_rows),
							  MaxAllocHugeSize / sizeof(AmrBuildEntry));
			bs.boxes = build_alloc(bs.capboxes * sizeof(AmrBuildEntry));
		}
	}
	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, AMR_PHASE_SCAN);
	if (!parallel_scan(heap, index, indexInfo, &bs, &reltuples))
		reltuples = table_index_build_scan(heap, index, indexInfo, true, true,
										   build_callback, (void *) &bs, NULL);
	MemoryContextDelete(bs.rowmem.cxt);
	if (bs.spill)
	{
		/*
		 * The last rows to the runs, their memory back, and any merge passes
		 * before the last: the sort, as btree reports its own.
		 */
		pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, AMR_PHASE_SORT);
		spill_collected(&bs);
		if (bs.boxes)
			pfree(bs.boxes);
		if (bs.nulls)
			pfree(bs.nulls);
		bs.boxes = bs.nulls = NULL;
		nrows = amr_spill_rows(bs.spill, false) + amr_spill_rows(bs.spill, true);
		amr_spill_finish_runs(bs.spill);
	}
	else
		nrows = bs.nboxes + bs.nnulls;

	/*
	 * Every row seen was inserted by a WAL record before this point, so the
	 * current insert position bounds them all (docs/design.md, "No phantom
	 * rows").
	 */
	lsn = amr_insert_lsn();
	pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_TOTAL, (int64) nrows);
	memset(&bl, 0, sizeof(bl));
	bl.t = t;
	bl.enabled = amr_wal_wanted(t, index);
	if (bs.spill)
	{
		build_side_spilled(index, t, bs.spill, false, lsn, &done, &bl);
		build_side_spilled(index, t, bs.spill, true, lsn, &done, &bl);
		amr_spill_end(bs.spill);
	}
	else
	{
		build_side(index, t, bs.boxes, bs.nboxes, false, lsn, &done, &bl);
		build_side(index, t, bs.nulls, bs.nnulls, true, lsn, &done, &bl);
	}
	if (bl.enabled)
		amr_wal_tree_built(t);

	amr_metapage_write(index, MAIN_FORKNUM, tree_no);
	AMR_FAULT_POINT("build:after_metapage");

	/*
	 * An unlogged index rebuilt in place (a TRUNCATE of a table created in
	 * the same transaction) keeps its init fork: point it at the new tree.
	 */
	if (unlogged && smgrexists(RelationGetSmgr(index), INIT_FORKNUM))
		amr_metapage_write(index, INIT_FORKNUM, tree_no);

	if (bs.boxes)
		pfree(bs.boxes);
	if (bs.nulls)
		pfree(bs.nulls);

	result = (IndexBuildResult *) palloc(sizeof(IndexBuildResult));
	result->heap_tuples = reltuples;
	result->index_tuples = (double) nrows;
	return result;
}

void
amrbuildempty(Relation index)
{
	/* under pg_upgrade amrbuild made no tree: see there */
	if (IsBinaryUpgrade)
	{
		amr_metapage_write(index, INIT_FORKNUM, AMR_NO_TREE);
		return;
	}
	amr_metapage_write(index, INIT_FORKNUM, amr_tree_open(index)->tree_no);
}
