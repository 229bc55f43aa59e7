/*-------------------------------------------------------------------------
 *
 * amr_knn.h
 *		Incremental best-first nearest-neighbour search over one tree (the
 *		box side), for "ORDER BY key <-> point" (GiST strategy 15).
 *
 * One binary min-heap holds three kinds of items: inner nodes and leaves,
 * keyed by a lower bound of the distance from the query point to anything
 * below them (amr_fbox_point_lower_bound of their float4 box in the
 * parent), and entries, keyed by the distance the caller computed from the
 * leaf's float8 key.  The search pops the smallest item: an inner node is
 * expanded into its children, a leaf is handed to the caller to read (the
 * core never reads leaf images), an entry is returned.  Because every
 * unread entry lies below some queued node or leaf whose bound does not
 * exceed its distance, entries come out in ascending distance order.
 *
 * Ties: at equal keys, entries come before nodes and leaves (as in GiST),
 * so an entry is returned as soon as its distance is <= every bound still
 * queued; entries of equal distance come out in the caller's sequence
 * order among those queued together.  The order is deterministic for a
 * given tree and query, but entries that tie across leaves are not sorted
 * by seq overall: a leaf read later may hold a smaller seq at the same
 * distance.  (Putting nodes first would sort ties by seq overall, but
 * LIMIT 1 would then read every leaf whose bound ties with the answer: on
 * the unit tests' data, 5 to 19 times as many leaves.)  Distances order as
 * PostgreSQL's float8 does: NaN after everything.
 *
 * Protocol (the AM glue; the tests in test/core drive it the same way):
 *
 *	amr_knn_init(&s, realloc_fn, arg);				once per scan
 *	amr_knn_begin(&s, store, tree, &query);			each (re)scan: no lock
 *	for (;;)
 *	{
 *		tree lock (shared) if amr_knn_next_reads_tree(&s);
 *		step = amr_knn_next(&s, &r);
 *		release the tree lock;
 *		DONE:	stop.
 *		ENTRY:	return r.payload, r.distance, r.recheck.
 *		REFINE:	amr_knn_add_entry(&s, distance of r.payload, r.seq,
 *				r.payload, recheck) (an entry fed under a bound).
 *		LEAF:	read leaf r.leaf_id (under its leaf lock) and, for every
 *				live entry, amr_knn_add_entry(&s, distance, seq, payload,
 *				recheck); if the leaf's NSN exceeds r.split_stamp, also
 *				amr_knn_add_leaf(&s, its right link, r.distance,
 *				r.split_stamp) (GiST's scheme, as amr_scan.c uses it).
 *	}
 *
 * Concurrency.  Inner nodes are read only inside amr_knn_next, which needs
 * the tree lock in shared mode when amr_knn_next_reads_tree() says so.
 * Between calls the lock may be released and splits may run:
 *	- A leaf split moves entries to a new leaf that the leaf's right link
 *	  reaches; each leaf item carries the tree's split counter at the time
 *	  its id was read from its parent, so the caller can tell whether the
 *	  leaf split since (the right half inherits the bound: its entries were
 *	  under the old box).
 *	- An inner-node split moves children of a queued node to a new sibling
 *	  that the queue does not know about.  Inner nodes have no right links,
 *	  but they are only added, so the tree's inner-node count detects it --
 *	  except when they are all freed and packed again (a standby's tree
 *	  whose replay left them stale), which the tree's inner_epoch counts:
 *	  queued node ids then name freed nodes.  Returning entries stays
 *	  correct until that node is expanded (its bound still covers the moved
 *	  children), so the check is made before each expansion; when the count
 *	  or the epoch changed, the search restarts from the root and drops
 *	  every entry fed again that was returned already: those closer than
 *	  the last one returned, and those at its distance whose seq it
 *	  remembers (the seqs returned at the current distance are kept for
 *	  this).  So seq must identify the entry (e.g. its heap TID), not the
 *	  order it was fed in.  Splits of the NULL side also change the count;
 *	  the restart is then merely unnecessary.
 *
 * Memory: the queue (24 bytes an item) and the seqs of every entry returned
 * (8 bytes each, for restarts), through realloc_fn, kept across amr_knn_begin so
 * that rescans allocate nothing.  Release s.heap and s.returned with the
 * allocator's own free (or its memory context).
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_KNN_H
#define AMR_KNN_H

#include "amr_tree.h"

/* What amr_knn_next hands back. */
typedef enum AmrKnnStep
{
	AMR_KNN_DONE = 0,			/* no entry is left */
	AMR_KNN_LEAF,				/* read this leaf, feed its entries, call
								 * again */
	AMR_KNN_ENTRY,				/* the next entry by distance */
	AMR_KNN_REFINE				/* an entry queued under a bound reached the
								 * head: compute its distance and feed it
								 * again (amr_knn_add_entry) */
} AmrKnnStep;

typedef struct AmrKnnResult
{
	double		distance;		/* ENTRY: as fed; LEAF: bound of its entries */
	bool		recheck;		/* ENTRY: distance is only a lower bound */
	uint64_t	seq;			/* ENTRY: the caller's tie-breaker */
	uint64_t	payload;		/* ENTRY: the caller's value */
	uint32_t	leaf_id;		/* LEAF */
	uint64_t	split_stamp;	/* LEAF: the tree's split counter
								 * (AmrTree.nsn) when this leaf's id was read */
} AmrKnnResult;

/*
 * A queued item.  order: bit 63 set for nodes and leaves, so that at equal
 * keys entries come first; bit 62 a flag (entry: recheck, no part in the
 * order; otherwise: leaf rather than inner node, and at equal keys leaves
 * come before nodes); bits 0-61 the
 * caller's seq for entries, a push counter for the others; bit 61, for
 * entries, that the key is only a bound (so that at equal keys entries with
 * their distance come first).  ref: the
 * caller's payload; a node index; or a leaf id in the low 32 bits and its
 * split stamp, less split_base, in the high 32 bits.
 */
typedef struct AmrKnnItem
{
	double		key;
	uint64_t	order;
	uint64_t	ref;
} AmrKnnItem;

#define AMR_KNN_ORDER_TREE		(UINT64_C(1) << 63)
#define AMR_KNN_ORDER_FLAG		(UINT64_C(1) << 62)
/* entries only: keyed by a bound, not yet by their distance (REFINE) */
#define AMR_KNN_ORDER_BOUND		(UINT64_C(1) << 61)
#define AMR_KNN_SEQ_MASK		(AMR_KNN_ORDER_BOUND - 1)

/*
 * A lower bound of the distance between the query (whose box is q) and any
 * value whose key lies in box b.  It must not exceed the bound of a box
 * inside b, or entries could come out of order.
 */
typedef double (*AmrKnnBoundFn) (const AmrFBox *b, const AmrBox *q, void *arg);

typedef struct AmrKnnSearch
{
	AmrReallocFn realloc_fn;
	void	   *realloc_arg;

	/* the priority queue: a binary min-heap on (key, order) */
	AmrKnnItem *heap;
	size_t		nitems;
	size_t		capacity;

	const AmrStore *store;
	const AmrTree *tree;
	AmrBox		query;			/* a point is a degenerate box */
	bool		lossy;			/* bounds for a lossy class's distances
								 * (amr_lossy_lower_bound) */
	AmrKnnBoundFn bound_fn;		/* the operator class's own bounds, or NULL */
	void	   *bound_arg;

	bool		tree_read;		/* the root has been queued */
	uint64_t	inner_nodes_seen;	/* AmrTree.ninner when nodes were read */
	uint64_t	inner_epoch_seen;	/* AmrTree.inner_epoch then */
	uint64_t	split_base;		/* AmrTree.nsn when the tree was first read */
	uint64_t	next_order;		/* push counter for nodes and leaves */

	/*
	 * The distance of the last entry returned, the seqs of every entry
	 * returned (the first nreturned_sorted sorted, by a restart), and whether
	 * entries fed again after a restart must be checked against them.
	 */
	bool		returned_any;
	double		last_distance;
	uint64_t   *returned;
	size_t		nreturned;
	size_t		returned_capacity;
	size_t		nreturned_sorted;
	bool		drop_returned;

	/* statistics of the current search */
	uint64_t	nodes_expanded;
	uint64_t	leaves_returned;
	uint64_t	entries_added;
	uint64_t	entries_returned;
	uint64_t	entries_dropped;	/* fed again after a restart, already
									 * returned */
	uint64_t	entries_late;	/* fed closer than the last entry returned:
								 * the leaf's bound did not hold for them */
	uint64_t	restarts;
	size_t		max_items;
} AmrKnnSearch;

/* Prepare a search object; allocates nothing. */
extern void amr_knn_init(AmrKnnSearch *s, AmrReallocFn realloc_fn,
						 void *realloc_arg);

/*
 * Start (or restart, for a rescan) a search of tree's box side for query,
 * keeping the queue's memory.  Reads nothing from the tree.
 */
extern void amr_knn_begin(AmrKnnSearch *s, const AmrStore *store,
						  const AmrTree *tree, const AmrPoint *query);

/*
 * The same for a query that is a box (the bounding box of a query value of
 * a lossy operator class): bounds are distances between boxes.
 */
extern void amr_knn_begin_box(AmrKnnSearch *s, const AmrStore *store,
							  const AmrTree *tree, const AmrBox *query);

/*
 * After amr_knn_begin_box: the distances the executor checks the bounds
 * against are a lossy operator class's (circle, polygon), not the boxes'.
 */
extern void amr_knn_set_lossy(AmrKnnSearch *s, bool lossy);

/*
 * After amr_knn_begin_box: bound nodes and leaves by fn instead of the
 * planar distance between boxes (an operator class whose keys are not
 * planar, such as longitude/latitude boxes on a sphere).
 */
extern void amr_knn_set_bound_fn(AmrKnnSearch *s, AmrKnnBoundFn fn, void *arg);

/*
 * The search's bound for box b (a node's, a leaf's, or a lossy entry's key
 * rounded to float4): the bound function's, else the planar distance,
 * lowered for a lossy class.
 */
extern double amr_knn_box_bound(const AmrKnnSearch *s, const AmrFBox *b);

/* Whether the next amr_knn_next call may read inner nodes (tree lock). */
extern bool amr_knn_next_reads_tree(const AmrKnnSearch *s);

/*
 * The next step: the next entry by distance, a leaf to read, or the end.
 * Caller holds the tree lock in shared mode if amr_knn_next_reads_tree()
 * returned true.
 */
extern AmrKnnStep amr_knn_next(AmrKnnSearch *s, AmrKnnResult *out);

/*
 * Feed one entry of the leaf last returned: its distance (at least the
 * leaf's bound; a lower bound needing recheck if recheck is set), its tie
 * order seq (below 2^61, identifying the entry) and the caller's payload.
 */
extern void amr_knn_add_entry(AmrKnnSearch *s, double distance, uint64_t seq,
							  uint64_t payload, bool recheck);

/*
 * Feed an entry under a lower bound of its distance instead of the distance
 * itself, for distances that are dear to compute: when it reaches the head
 * of the queue, amr_knn_next returns AMR_KNN_REFINE (seq, payload, and the
 * bound as distance) and the caller feeds it again with amr_knn_add_entry
 * and its distance, which must not be below the bound.  Entries that never
 * reach the head are never computed.
 */
extern void amr_knn_add_entry_bound(AmrKnnSearch *s, double bound, uint64_t seq,
									uint64_t payload);

/*
 * Queue a leaf the caller found by a right link, with the bound and split
 * stamp of the leaf whose right link it followed.
 */
extern void amr_knn_add_leaf(AmrKnnSearch *s, uint32_t leaf_id, double bound,
							 uint64_t split_stamp);

#endif							/* AMR_KNN_H */
