/*-------------------------------------------------------------------------
 *
 * amr_build.h
 *		The bulk build's rows, and the runs a build larger than
 *		maintenance_work_mem sorts them in (amr_build.c, amr_buildspill.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_BUILD_H
#define AMR_BUILD_H

#include "amr_leafstore.h"

#include "storage/dsm_impl.h"
#include "storage/spin.h"

/*
 * A row as the heap scan collects it: what a leaf entry holds but its WAL
 * position, which is the same for the whole build -- 40 bytes instead of
 * 48, 80 MB less fresh memory at 10M rows.
 */
typedef struct AmrBuildEntry
{
	AmrBox		key;
	ItemPointerData tid;
	uint16		flags;
} AmrBuildEntry;

/*
 * What sorting a row in memory costs: the row, its point item and the radix
 * sort's scratch item, and its size class.  A build keeps at most
 * maintenance_work_mem / AMR_BUILD_BYTES_PER_ROW rows in memory at once.
 */
#define AMR_BUILD_BYTES_PER_ROW \
	(sizeof(AmrBuildEntry) + 2 * sizeof(AmrPackPoint) + sizeof(uint8))

/* A hint to fetch the memory at p into the cache. */
#if defined(__GNUC__) || defined(__clang__)
#define amr_build_prefetch(p) __builtin_prefetch(p)
#else
#define amr_build_prefetch(p) ((void) 0)
#endif

/* The size-class limit of rows[0..n-1], from a sample of 1,024 spread over them. */
extern double amr_build_class_base(const AmrBuildEntry *rows, Size n);

/* Point items (ref = position) and size classes of rows[0..n-1]. */
extern void amr_build_points(const AmrBuildEntry *rows, Size n, double base,
							 AmrPackPoint *items, uint8 *cls);

/*
 * Sorted runs on disk (amr_buildspill.c).  The rows are handed over in
 * chunks of at most chunk_rows; each chunk is sorted by size class and
 * centre x and written as a run to a temporary file.  Read back, the runs
 * are merged and the rows come out one STR slice at a time, leaf after leaf
 * (the leaves amr_pack_points_order's order gives in memory, but for rows of
 * equal keys), each leaf's rows in heap order.  NULL keys are kept in scan
 * order (each participant's of a parallel build in its own).
 */
typedef struct AmrSpill AmrSpill;

/* Runs for chunks of up to chunk_rows rows, leaves of fill rows; mem bounds the merge. */
extern AmrSpill *amr_spill_begin(Size chunk_rows, int fill, Size mem);

/*
 * A parallel build whose participants sort runs of their own (amr_build.c,
 * parallel_scan): in the parallel context's shared memory.  The size
 * classes' limit is the first chunk's of whichever participant fills one
 * first; the workers' runs are in a SharedFileSet in a segment of its own,
 * which the leader's AmrSpill keeps attached, so the runs outlive the
 * workers and the parallel context until the merge is done.
 */
typedef struct AmrSpillShared
{
	slock_t		mutex;
	bool		have_base;
	double		base;
	dsm_handle	files;
} AmrSpillShared;

/*
 * The leader's spill of a parallel build that sorts in every participant:
 * as amr_spill_begin, and shared set up; NULL if no segment for the
 * workers' files can be had.
 */
extern AmrSpill *amr_spill_begin_parallel(Size chunk_rows, int fill, Size mem,
										  AmrSpillShared *shared);

/* A worker's spill: its runs and NULL keys go to the leader's file set. */
extern AmrSpill *amr_spill_begin_worker(Size chunk_rows, int fill, AmrSpillShared *shared,
										int worker);

/* In a worker, after its last rows: list its runs for the leader, close, free. */
extern void amr_spill_worker_done(AmrSpill *sp);

/*
 * In the leader, once workers 0..nworkers-1 have finished and before the
 * shared memory goes: add their runs and NULL keys, and keep the agreed
 * class limit.
 */
extern void amr_spill_take_workers(AmrSpill *sp, int nworkers);

/* Sort and write rows[0..n-1] (non-NULL keys) as a run. */
extern void amr_spill_add_rows(AmrSpill *sp, const AmrBuildEntry *rows, Size n);

/* Append rows[0..n-1] (NULL keys) to the NULL-key file. */
extern void amr_spill_add_nulls(AmrSpill *sp, const AmrBuildEntry *rows, Size n);

/* Rows handed over, with non-NULL or NULL keys. */
extern Size amr_spill_rows(AmrSpill *sp, bool nulls);

/* The leaves the rows with non-NULL (or NULL) keys will fill. */
extern Size amr_spill_leaves(AmrSpill *sp, bool nulls);

/*
 * Done adding rows: free the chunk's memory, merge the runs down to as many
 * as one merge takes, and get ready to read slices.
 */
extern void amr_spill_finish_runs(AmrSpill *sp);

/*
 * The next STR slice of the non-NULL keys, fill rows a leaf: *rows points
 * to them (valid until the next call); returns their number, 0 after the
 * last.  Every slice but a size class's last holds whole leaves.
 */
extern Size amr_spill_next_slice(AmrSpill *sp, AmrBuildEntry **rows);

/* The next up to max rows with NULL keys into buf; returns how many, 0 at the end. */
extern Size amr_spill_next_nulls(AmrSpill *sp, AmrBuildEntry *buf, Size max);

/* Close and delete the temporary files and free the memory. */
extern void amr_spill_end(AmrSpill *sp);

#endif							/* AMR_BUILD_H */
