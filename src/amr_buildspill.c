/*-------------------------------------------------------------------------
 *
 * amr_buildspill.c
 *		A bulk build larger than maintenance_work_mem: its rows sorted in
 *		runs on temporary files, merged back one STR slice at a time.
 *
 * In memory, a build puts every row in STR order at once (amr_build.c,
 * pack_order): rows by size class, each class by centre x, cut into
 * slices of a whole number of leaves, each slice by centre y.  Only the
 * first of those sorts needs every row: once the rows of a class come in x
 * order, a slice is complete as soon as its last row has come, and a slice
 * is small (about sqrt(rows x fill) rows: 26,000 rows, 1 MB, at 10M rows).
 * So the rows are sorted in chunks that fit in maintenance_work_mem, each
 * chunk written as a run to a temporary file (BufFile, removed at
 * transaction end whatever happens) with a segment per size class in
 * centre x order; then each class's segments are merged, at most
 * MAX_MERGE_ORDER runs at a time (more runs take further passes, each
 * writing longer runs), and the merged rows are cut into slices as they
 * arrive, each sorted by y in memory.  The classes need a limit fixed
 * before the first run is written: it is sampled from the first chunk
 * rather than from every row.  So classes may differ from a build in
 * memory, and rows of equal x keys may fall into other slices (the merge
 * breaks their ties by y, the sort in memory by scan order); the leaves
 * are as full as in memory, and every row is in exactly one.
 *
 * In a parallel build every participant sorts runs of its own chunks
 * (amr_build.c, parallel_scan): a worker writes its runs and its NULL keys
 * into a SharedFileSet, with a directory file listing each run's class
 * segments, and the leader adds them to its own runs once the workers are
 * done.  The first participant to fill a chunk fixes the class limit for
 * all (AmrSpillShared), so that every run's classes are the same.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_build.h"

#include "miscadmin.h"
#include "storage/buffile.h"
#include "storage/dsm.h"
#include "storage/sharedfileset.h"
#include "utils/memutils.h"

/*
 * Runs merged at once, at most (as tuplesort caps its merge order): each
 * open run holds a BLCKSZ buffer, and more runs than kernel file
 * descriptors would make every refill reopen a file.
 */
#define MAX_MERGE_ORDER		500

/* Rows ahead that writing a run fetches (they are scattered over the chunk). */
#define SPILL_PREFETCH		16

/* Names of the files a worker makes in the shared file set. */
#define SPILL_NAME_LEN		32

/* A row in a run, with its sort key. */
typedef struct SpillRecord
{
	uint64		key;			/* centre x key << 32 | centre y key */
	AmrBuildEntry row;
} SpillRecord;

/*
 * A run: one temporary file, the chunk's rows of each size class in a
 * segment of their own, by centre x.  Classes are merged one after the
 * other, so the key need not hold the class and can hold y, which the
 * slice is sorted by next.
 */
typedef struct SpillRunSegments
{
	int			seg_fileno[AMR_SIZE_CLASSES];
	off_t		seg_offset[AMR_SIZE_CLASSES];
	Size		seg_rows[AMR_SIZE_CLASSES];
} SpillRunSegments;

typedef struct SpillRun
{
	BufFile    *file;
	SpillRunSegments s;
	char		name[SPILL_NAME_LEN];	/* in the shared file set, or "" */
} SpillRun;

/*
 * What a parallel worker leaves for the leader beside its runs: a file
 * "w<worker>.dir" holding this header and a SpillRunSegments per run
 * ("w<worker>.r<run>"), and its NULL keys in "w<worker>.nulls".
 */
typedef struct SpillWorkerDir
{
	int			nruns;
	Size		nnulls;
} SpillWorkerDir;

/*
 * A merge of one size class's segments of some runs: a binary min-heap of
 * run numbers by their head record.
 */
typedef struct SpillMerge
{
	int			nruns;
	SpillRun   *runs;
	Size	   *left;			/* rows of the segment after the head */
	SpillRecord *heads;
	int		   *heap;
	int			nheap;
} SpillMerge;

struct AmrSpill
{
	MemoryContext cxt;
	int			fill;
	Size		chunk_rows;
	int			merge_order;

	/* the size classes' limit, from the first chunk */
	bool		have_base;
	double		base;

	/*
	 * A parallel build whose participants sort runs of their own: the limit
	 * agreed on (until amr_spill_take_workers), and the file set the workers'
	 * runs are in.  worker is the worker's number in a worker, -1 in the
	 * leader.
	 */
	AmrSpillShared *shared;
	dsm_segment *files_seg;
	SharedFileSet *files;
	int			worker;

	/* sorting a chunk: chunk_rows each, freed when the merge begins */
	AmrPackPoint *items;
	AmrPackPoint *scratch;
	uint8	   *cls;

	/* the runs written so far */
	SpillRun   *runs;
	int			nruns;
	int			maxruns;
	Size		class_rows[AMR_SIZE_CLASSES];
	Size		nrows;

	/*
	 * NULL keys, in scan order: nullfile is this process's, written; the
	 * files to read back are nullfiles (in the leader, its own and the
	 * workers').
	 */
	BufFile    *nullfile;
	Size		nnulls;
	BufFile   **nullfiles;
	int			nnullfiles;
	int			maxnullfiles;
	int			nulls_reading;	/* in nullfiles */

	/* reading back: the merge of the current class and the slice being cut */
	bool		reading;
	bool		merging;
	SpillMerge	merge;
	int			cur_class;
	Size		class_left;
	Size		slice_items;
	AmrBuildEntry *slice_in;	/* as merged */
	uint32	   *slice_ykey;		/* as merged */
	AmrBuildEntry *slice_out;	/* leaf after leaf */
	AmrPackPoint *slice_heap;	/* heap order: block, offset, row */
	AmrPackPoint *slice_points; /* y order: y key, heap rank */
	AmrPackPoint *slice_scratch;
	uint32	   *leaf_of;		/* by heap rank: leaf in the slice */
	uint32	   *leaf_next;		/* by leaf: where its next row goes */
};

AmrSpill *
amr_spill_begin(Size chunk_rows, int fill, Size mem)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree build runs",
											  ALLOCSET_DEFAULT_SIZES);
	AmrSpill   *sp = MemoryContextAllocZero(cxt, sizeof(AmrSpill));

	sp->cxt = cxt;
	sp->fill = fill;
	sp->chunk_rows = chunk_rows;
	sp->merge_order = (int) Max(Min(mem / (2 * BLCKSZ), MAX_MERGE_ORDER), 2);
	sp->items = MemoryContextAllocHuge(cxt, sizeof(AmrPackPoint) * (chunk_rows + 1));
	sp->scratch = MemoryContextAllocHuge(cxt, sizeof(AmrPackPoint) * (chunk_rows + 1));
	sp->cls = MemoryContextAllocHuge(cxt, chunk_rows + 1);
	sp->maxruns = 16;
	sp->runs = MemoryContextAlloc(cxt, sizeof(SpillRun) * sp->maxruns);
	sp->worker = -1;
	sp->maxnullfiles = 4;
	sp->nullfiles = MemoryContextAlloc(cxt, sizeof(BufFile *) * sp->maxnullfiles);
	return sp;
}

AmrSpill *
amr_spill_begin_parallel(Size chunk_rows, int fill, Size mem, AmrSpillShared *shared)
{
	dsm_segment *seg = dsm_create(sizeof(SharedFileSet), DSM_CREATE_NULL_IF_MAXSEGMENTS);
	AmrSpill   *sp;

	if (seg == NULL)
		return NULL;
	sp = amr_spill_begin(chunk_rows, fill, mem);
	sp->files_seg = seg;
	sp->files = dsm_segment_address(seg);
	SharedFileSetInit(sp->files, seg);
	SpinLockInit(&shared->mutex);
	shared->have_base = false;
	shared->base = 0;
	shared->files = dsm_segment_handle(seg);
	sp->shared = shared;
	return sp;
}

AmrSpill *
amr_spill_begin_worker(Size chunk_rows, int fill, AmrSpillShared *shared, int worker)
{
	AmrSpill   *sp = amr_spill_begin(chunk_rows, fill, 0);

	sp->files_seg = dsm_attach(shared->files);
	if (sp->files_seg == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree build: could not attach to the leader's temporary file set")));
	sp->files = dsm_segment_address(sp->files_seg);
	SharedFileSetAttach(sp->files, sp->files_seg);
	sp->shared = shared;
	sp->worker = worker;
	return sp;
}

/* One more run in sp->runs, zeroed, without a file yet. */
static SpillRun *
append_run(AmrSpill *sp)
{
	SpillRun   *run;

	if (sp->nruns == sp->maxruns)
	{
		sp->maxruns *= 2;
		sp->runs = repalloc(sp->runs, sizeof(SpillRun) * sp->maxruns);
	}
	run = &sp->runs[sp->nruns++];
	memset(run, 0, sizeof(*run));
	return run;
}

/* A new run, in the spill's memory; its file is created empty. */
static SpillRun *
new_run(AmrSpill *sp)
{
	MemoryContext old = MemoryContextSwitchTo(sp->cxt);
	SpillRun   *run = append_run(sp);

	if (sp->worker >= 0)
	{
		/* a worker's, for the leader to read: named in the shared set */
		snprintf(run->name, sizeof(run->name), "w%d.r%d", sp->worker, sp->nruns - 1);
		run->file = BufFileCreateFileSet(&sp->files->fs, run->name);
	}
	else
		run->file = BufFileCreateTemp(false);
	MemoryContextSwitchTo(old);
	return run;
}

/* Done with a run that has been merged into another: its file goes. */
static void
drop_run(AmrSpill *sp, SpillRun *run)
{
	BufFileClose(run->file);
	if (run->name[0] != '\0')
		BufFileDeleteFileSet(&sp->files->fs, run->name, false);
}

/* A file of NULL keys, to be read back (or, in a worker, closed) in turn. */
static void
add_null_file(AmrSpill *sp, BufFile *file)
{
	if (sp->nnullfiles == sp->maxnullfiles)
	{
		sp->maxnullfiles *= 2;
		sp->nullfiles = repalloc(sp->nullfiles, sizeof(BufFile *) * sp->maxnullfiles);
	}
	sp->nullfiles[sp->nnullfiles++] = file;
}

/* len bytes of file into buf (they must be there). */
static void
read_exactly(BufFile *file, void *buf, size_t len)
{
	size_t		got = BufFileRead(file, buf, len);

	if (got != len)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read from amrtree build temporary file: read only %zu of %zu bytes",
						got, len)));
}

/* The next record of a run into *rec (one must be there). */
static inline void
read_record(BufFile *file, SpillRecord *rec)
{
	read_exactly(file, rec, sizeof(*rec));
}

void
amr_spill_add_rows(AmrSpill *sp, const AmrBuildEntry *rows, Size n)
{
	size_t		counts[AMR_SIZE_CLASSES];
	Size		sum = 0;
	SpillRun   *run;
	Size		i;
	int			c;

	Assert(n <= sp->chunk_rows);
	if (n == 0)
		return;
	CHECK_FOR_INTERRUPTS();
	if (!sp->have_base)
	{
		double		base = amr_build_class_base(rows, n);

		/* in a parallel build, the first participant's chunk sets it for all */
		if (sp->shared)
		{
			SpinLockAcquire(&sp->shared->mutex);
			if (!sp->shared->have_base)
			{
				sp->shared->base = base;
				sp->shared->have_base = true;
			}
			base = sp->shared->base;
			SpinLockRelease(&sp->shared->mutex);
		}
		sp->base = base;
		sp->have_base = true;
	}

	/* by class, then each class by centre x */
	amr_build_points(rows, n, sp->base, sp->items, sp->cls);
	amr_pack_points_by_class(sp->items, sp->cls, n, sp->scratch, counts);

	run = new_run(sp);
	for (c = 0; c < AMR_SIZE_CLASSES; c++)
	{
		AmrPackPoint *part = sp->items + sum;

		amr_pack_points_sort(part, counts[c], 0, sp->scratch);
		BufFileTell(run->file, &run->s.seg_fileno[c], &run->s.seg_offset[c]);
		for (i = 0; i < counts[c]; i++)
		{
			SpillRecord rec;

			/* the rows are gathered across the chunk: fetch ahead */
			if (i + SPILL_PREFETCH < counts[c])
				amr_build_prefetch(&rows[part[i + SPILL_PREFETCH].ref]);
			rec.key = ((uint64) part[i].xkey << 32) | part[i].ykey;
			rec.row = rows[part[i].ref];
			BufFileWrite(run->file, &rec, sizeof(rec));
		}
		run->s.seg_rows[c] = counts[c];
		sp->class_rows[c] += counts[c];
		sum += counts[c];
	}
	sp->nrows += n;
}

void
amr_spill_add_nulls(AmrSpill *sp, const AmrBuildEntry *rows, Size n)
{
	if (n == 0)
		return;
	if (sp->nullfile == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(sp->cxt);

		if (sp->worker >= 0)
		{
			char		name[SPILL_NAME_LEN];

			snprintf(name, sizeof(name), "w%d.nulls", sp->worker);
			sp->nullfile = BufFileCreateFileSet(&sp->files->fs, name);
		}
		else
			sp->nullfile = BufFileCreateTemp(false);
		add_null_file(sp, sp->nullfile);
		MemoryContextSwitchTo(old);
	}
	BufFileWrite(sp->nullfile, (void *) rows, n * sizeof(AmrBuildEntry));
	sp->nnulls += n;
}

Size
amr_spill_rows(AmrSpill *sp, bool nulls)
{
	return nulls ? sp->nnulls : sp->nrows;
}

Size
amr_spill_leaves(AmrSpill *sp, bool nulls)
{
	Size		leaves = 0;
	int			c;

	if (nulls)
		return (sp->nnulls + sp->fill - 1) / sp->fill;
	for (c = 0; c < AMR_SIZE_CLASSES; c++)
		leaves += (sp->class_rows[c] + sp->fill - 1) / sp->fill;
	return leaves;
}

/* ---- merging runs ---- */

static inline bool
merge_precedes(const SpillMerge *m, int a, int b)
{
	/* equal keys: the earlier run first, so that merging is stable */
	return m->heads[a].key < m->heads[b].key ||
		(m->heads[a].key == m->heads[b].key && a < b);
}

static void
merge_sift_down(SpillMerge *m, int pos)
{
	for (;;)
	{
		int			child = 2 * pos + 1;
		int			tmp;

		if (child >= m->nheap)
			break;
		if (child + 1 < m->nheap && merge_precedes(m, m->heap[child + 1], m->heap[child]))
			child++;
		if (!merge_precedes(m, m->heap[child], m->heap[pos]))
			break;
		tmp = m->heap[pos];
		m->heap[pos] = m->heap[child];
		m->heap[child] = tmp;
		pos = child;
	}
}

/* Start merging size class cls of runs[0..nruns-1]. */
static void
merge_begin(SpillMerge *m, SpillRun *runs, int nruns, int cls)
{
	int			i;

	m->nruns = nruns;
	m->runs = runs;
	m->left = palloc(sizeof(Size) * nruns);
	m->heads = palloc(sizeof(SpillRecord) * nruns);
	m->heap = palloc(sizeof(int) * nruns);
	m->nheap = 0;
	for (i = 0; i < nruns; i++)
	{
		m->left[i] = runs[i].s.seg_rows[cls];
		if (m->left[i] == 0)
			continue;
		if (BufFileSeek(runs[i].file, runs[i].s.seg_fileno[cls], runs[i].s.seg_offset[cls],
						SEEK_SET) != 0)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("could not seek in amrtree build temporary file: %m")));
		read_record(runs[i].file, &m->heads[i]);
		m->left[i]--;
		m->heap[m->nheap++] = i;
	}
	for (i = m->nheap / 2 - 1; i >= 0; i--)
		merge_sift_down(m, i);
}

/* The next record of the merge into *rec; false when every segment is done. */
static bool
merge_next(SpillMerge *m, SpillRecord *rec)
{
	int			top;

	if (m->nheap == 0)
		return false;
	top = m->heap[0];
	*rec = m->heads[top];
	if (m->left[top] > 0)
	{
		read_record(m->runs[top].file, &m->heads[top]);
		m->left[top]--;
	}
	else
		m->heap[0] = m->heap[--m->nheap];
	merge_sift_down(m, 0);
	return true;
}

static void
merge_end(SpillMerge *m)
{
	pfree(m->left);
	pfree(m->heads);
	pfree(m->heap);
}

/*
 * Merge runs, merge_order at a time, into fewer longer runs until one merge
 * can take them all.  Groups are consecutive, so the order of equal keys
 * stays the order of the runs.
 */
static void
reduce_runs(AmrSpill *sp)
{
	if (sp->nruns > sp->merge_order)
		ereport(DEBUG1,
				(errmsg_internal("amrtree build: %d sorted runs, more than the %d one merge takes; merging them in passes",
								 sp->nruns, sp->merge_order)));
	while (sp->nruns > sp->merge_order)
	{
		SpillRun   *old = sp->runs;
		int			nold = sp->nruns;
		int			first;

		sp->runs = palloc(sizeof(SpillRun) * sp->maxruns);
		sp->nruns = 0;
		for (first = 0; first < nold; first += sp->merge_order)
		{
			int			k = Min(sp->merge_order, nold - first);
			SpillRun   *out;
			int			c;
			int			i;

			CHECK_FOR_INTERRUPTS();
			if (k == 1)
			{
				sp->runs[sp->nruns++] = old[first];
				continue;
			}
			out = new_run(sp);
			for (c = 0; c < AMR_SIZE_CLASSES; c++)
			{
				SpillMerge	m;
				SpillRecord rec;

				BufFileTell(out->file, &out->s.seg_fileno[c], &out->s.seg_offset[c]);
				merge_begin(&m, old + first, k, c);
				while (merge_next(&m, &rec))
				{
					BufFileWrite(out->file, &rec, sizeof(rec));
					out->s.seg_rows[c]++;
				}
				merge_end(&m);
			}
			for (i = first; i < first + k; i++)
				drop_run(sp, &old[i]);
		}
		pfree(old);
	}
}

void
amr_spill_finish_runs(AmrSpill *sp)
{
	MemoryContext old = MemoryContextSwitchTo(sp->cxt);
	Size		max_slice = 0;
	int			c;

	pfree(sp->items);
	pfree(sp->scratch);
	pfree(sp->cls);
	sp->items = sp->scratch = NULL;
	sp->cls = NULL;

	reduce_runs(sp);

	/* this process's NULL keys were written: back to their start */
	if (sp->nullfile && BufFileSeek(sp->nullfile, 0, 0, SEEK_SET) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not rewind amrtree build temporary file: %m")));

	for (c = 0; c < AMR_SIZE_CLASSES; c++)
		max_slice = Max(max_slice, amr_str_slice_items(sp->class_rows[c], sp->fill));
	sp->slice_in = MemoryContextAllocHuge(sp->cxt, sizeof(AmrBuildEntry) * (max_slice + 1));
	sp->slice_ykey = MemoryContextAllocHuge(sp->cxt, sizeof(uint32) * (max_slice + 1));
	sp->slice_out = MemoryContextAllocHuge(sp->cxt, sizeof(AmrBuildEntry) * (max_slice + 1));
	sp->slice_heap = MemoryContextAllocHuge(sp->cxt, sizeof(AmrPackPoint) * (max_slice + 1));
	sp->slice_points = MemoryContextAllocHuge(sp->cxt, sizeof(AmrPackPoint) * (max_slice + 1));
	sp->slice_scratch = MemoryContextAllocHuge(sp->cxt, sizeof(AmrPackPoint) * (max_slice + 1));
	sp->leaf_of = MemoryContextAllocHuge(sp->cxt, sizeof(uint32) * (max_slice + 1));
	sp->leaf_next = MemoryContextAllocHuge(sp->cxt, sizeof(uint32) * (max_slice / sp->fill + 2));
	sp->cur_class = -1;
	sp->class_left = 0;
	sp->reading = true;
	MemoryContextSwitchTo(old);
}

/*
 * The next slice: its rows taken from the merge, put in STR order by centre
 * y and cut into leaves of fill rows; each leaf's rows in heap order, so
 * that an index scan fetches them block by block (order_leaves_by_heap
 * does the same for a build in memory, by the same counting pass: the
 * rows are ranked in heap order first, a stable sort by y keeps that
 * order among equal keys, and the rows, taken by rank, are dealt to their
 * leaves).
 */
Size
amr_spill_next_slice(AmrSpill *sp, AmrBuildEntry **rows)
{
	SpillRecord rec;
	Size		take;
	Size		nleaves;
	Size		i;

	Assert(sp->reading);
	while (sp->class_left == 0)
	{
		MemoryContext old;

		if (sp->merging)
		{
			merge_end(&sp->merge);
			sp->merging = false;
		}
		if (sp->cur_class + 1 >= AMR_SIZE_CLASSES)
			return 0;
		sp->cur_class++;
		sp->class_left = sp->class_rows[sp->cur_class];
		sp->slice_items = amr_str_slice_items(sp->class_left, sp->fill);
		old = MemoryContextSwitchTo(sp->cxt);
		merge_begin(&sp->merge, sp->runs, sp->nruns, sp->cur_class);
		MemoryContextSwitchTo(old);
		sp->merging = true;
	}
	CHECK_FOR_INTERRUPTS();

	take = Min(sp->slice_items, sp->class_left);
	for (i = 0; i < take; i++)
	{
		if (!merge_next(&sp->merge, &rec))
			elog(ERROR, "amrtree build: the sorted runs do not hold the rows written to them");
		sp->slice_in[i] = rec.row;
		sp->slice_ykey[i] = (uint32) rec.key;
		sp->slice_heap[i].xkey = ItemPointerGetBlockNumberNoCheck(&rec.row.tid);
		sp->slice_heap[i].ykey = ItemPointerGetOffsetNumberNoCheck(&rec.row.tid);
		sp->slice_heap[i].ref = (uint32) i;
	}
	/* heap order: by offset, then stably by block */
	amr_pack_points_sort(sp->slice_heap, take, 1, sp->slice_scratch);
	amr_pack_points_sort(sp->slice_heap, take, 0, sp->slice_scratch);

	for (i = 0; i < take; i++)
	{
		sp->slice_points[i].xkey = 0;
		sp->slice_points[i].ykey = sp->slice_ykey[sp->slice_heap[i].ref];
		sp->slice_points[i].ref = (uint32) i;
	}
	amr_pack_points_sort(sp->slice_points, take, 1, sp->slice_scratch);

	nleaves = (take + sp->fill - 1) / sp->fill;
	for (i = 0; i < take; i++)
		sp->leaf_of[sp->slice_points[i].ref] = (uint32) (i / sp->fill);
	for (i = 0; i < nleaves; i++)
		sp->leaf_next[i] = (uint32) (i * sp->fill);
	for (i = 0; i < take; i++)
		sp->slice_out[sp->leaf_next[sp->leaf_of[i]]++] = sp->slice_in[sp->slice_heap[i].ref];

	sp->class_left -= take;
	*rows = sp->slice_out;
	return take;
}

Size
amr_spill_next_nulls(AmrSpill *sp, AmrBuildEntry *buf, Size max)
{
	Assert(sp->reading);
	while (sp->nulls_reading < sp->nnullfiles)
	{
		size_t		got;

		got = BufFileRead(sp->nullfiles[sp->nulls_reading], buf, max * sizeof(AmrBuildEntry));
		if (got % sizeof(AmrBuildEntry) != 0)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("could not read from amrtree build temporary file: read only %zu bytes",
							got)));
		if (got > 0)
			return got / sizeof(AmrBuildEntry);
		sp->nulls_reading++;
	}
	return 0;
}

void
amr_spill_end(AmrSpill *sp)
{
	int			i;

	if (sp->merging)
		merge_end(&sp->merge);
	for (i = 0; i < sp->nruns; i++)
		BufFileClose(sp->runs[i].file);
	for (i = 0; i < sp->nnullfiles; i++)
		BufFileClose(sp->nullfiles[i]);
	/* the last detach deletes the workers' files */
	if (sp->files_seg)
		dsm_detach(sp->files_seg);
	MemoryContextDelete(sp->cxt);
}

void
amr_spill_worker_done(AmrSpill *sp)
{
	SpillWorkerDir dir;
	BufFile    *file;
	char		name[SPILL_NAME_LEN];
	int			i;

	Assert(sp->worker >= 0);
	dir.nruns = sp->nruns;
	dir.nnulls = sp->nnulls;
	snprintf(name, sizeof(name), "w%d.dir", sp->worker);
	file = BufFileCreateFileSet(&sp->files->fs, name);
	BufFileWrite(file, &dir, sizeof(dir));
	for (i = 0; i < sp->nruns; i++)
		BufFileWrite(file, &sp->runs[i].s, sizeof(SpillRunSegments));
	BufFileClose(file);
	/* closing flushes the runs; the file set keeps them for the leader */
	amr_spill_end(sp);
}

/* Add worker's runs and NULL keys, as its directory file lists them. */
static void
take_worker_runs(AmrSpill *sp, int worker)
{
	SpillWorkerDir dir;
	BufFile    *file;
	char		name[SPILL_NAME_LEN];
	int			i;
	int			c;

	snprintf(name, sizeof(name), "w%d.dir", worker);
	file = BufFileOpenFileSet(&sp->files->fs, name, O_RDONLY, false);
	read_exactly(file, &dir, sizeof(dir));
	for (i = 0; i < dir.nruns; i++)
	{
		SpillRun   *run = append_run(sp);

		read_exactly(file, &run->s, sizeof(SpillRunSegments));
		snprintf(run->name, sizeof(run->name), "w%d.r%d", worker, i);
		run->file = BufFileOpenFileSet(&sp->files->fs, run->name, O_RDONLY, false);
		for (c = 0; c < AMR_SIZE_CLASSES; c++)
		{
			sp->class_rows[c] += run->s.seg_rows[c];
			sp->nrows += run->s.seg_rows[c];
		}
	}
	BufFileClose(file);
	if (dir.nnulls > 0)
	{
		snprintf(name, sizeof(name), "w%d.nulls", worker);
		add_null_file(sp, BufFileOpenFileSet(&sp->files->fs, name, O_RDONLY, false));
		sp->nnulls += dir.nnulls;
	}
}

void
amr_spill_take_workers(AmrSpill *sp, int nworkers)
{
	MemoryContext old = MemoryContextSwitchTo(sp->cxt);
	int			i;

	Assert(sp->worker < 0 && sp->shared != NULL && !sp->reading);
	for (i = 0; i < nworkers; i++)
		take_worker_runs(sp, i);
	MemoryContextSwitchTo(old);

	/* the class limit the runs were cut by, for this process's last run */
	SpinLockAcquire(&sp->shared->mutex);
	if (sp->shared->have_base)
	{
		sp->base = sp->shared->base;
		sp->have_base = true;
	}
	SpinLockRelease(&sp->shared->mutex);
	sp->shared = NULL;
}
