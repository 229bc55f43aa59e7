/*-------------------------------------------------------------------------
 *
 * amr_knn.c
 *		Incremental best-first nearest-neighbour search (see amr_knn.h).
 *
 * The queue is a binary min-heap of 24-byte items in one array that grows
 * by doubling through the caller's allocator and is never shrunk, so a
 * rescan reuses it.  Inner nodes are expanded lazily: a LIMIT k query reads
 * the nodes and leaves whose bounds are below the k-th distance (and some
 * of those whose bounds equal it), nothing else.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_knn.h"

#include <string.h>

/*
 * The order of items with equal keys: entries first (bit 63 clear; their
 * flag bit, the recheck, takes no part), then leaves, then inner nodes (the
 * flag bit inverted), each by seq.  Reading a leaf before expanding another
 * node at the same bound is GiST's depth-first rule for ties: on
 * overlapping data (coastlines) many level-1 boxes contain the query point,
 * all at bound 0, and expanding every one of them before reading the first
 * leaf pushed over a thousand items for a LIMIT 1.
 */
static inline uint64_t
tie_order(uint64_t order)
{
	return (order & AMR_KNN_ORDER_TREE) ? (order ^ AMR_KNN_ORDER_FLAG)
		: (order & ~AMR_KNN_ORDER_FLAG);
}

/* (key, order) comparison. */
static inline bool
item_precedes(const AmrKnnItem *a, const AmrKnnItem *b)
{
	if (amr_float8_lt(a->key, b->key))
		return true;
	if (!amr_float8_eq(a->key, b->key))
		return false;
	return tie_order(a->order) < tie_order(b->order);
}

static inline bool
is_entry(const AmrKnnItem *it)
{
	return (it->order & AMR_KNN_ORDER_TREE) == 0;
}

static inline bool
is_leaf(const AmrKnnItem *it)
{
	return !is_entry(it) && (it->order & AMR_KNN_ORDER_FLAG) != 0;
}

static inline bool
is_node(const AmrKnnItem *it)
{
	return !is_entry(it) && (it->order & AMR_KNN_ORDER_FLAG) == 0;
}

/* Move the item at pos up to where it belongs. */
static void
sift_up(AmrKnnItem *heap, size_t pos)
{
	AmrKnnItem	moving = heap[pos];

	while (pos > 0)
	{
		size_t		parent = (pos - 1) / 2;

		if (!item_precedes(&moving, &heap[parent]))
			break;
		heap[pos] = heap[parent];
		pos = parent;
	}
	heap[pos] = moving;
}

/* Move the item at pos down to where it belongs among n items. */
static void
sift_down(AmrKnnItem *heap, size_t n, size_t pos)
{
	AmrKnnItem	moving = heap[pos];

	for (;;)
	{
		size_t		child = 2 * pos + 1;

		if (child >= n)
			break;
		if (child + 1 < n && item_precedes(&heap[child + 1], &heap[child]))
			child++;
		if (!item_precedes(&heap[child], &moving))
			break;
		heap[pos] = heap[child];
		pos = child;
	}
	heap[pos] = moving;
}

static void
push(AmrKnnSearch *s, double key, uint64_t order, uint64_t ref)
{
	if (s->nitems == s->capacity)
	{
		size_t		newcap = s->capacity ? s->capacity * 2 : 256;

		s->heap = s->realloc_fn(s->heap, newcap * sizeof(AmrKnnItem),
								s->realloc_arg);
		s->capacity = newcap;
	}
	s->heap[s->nitems].key = key;
	s->heap[s->nitems].order = order;
	s->heap[s->nitems].ref = ref;
	sift_up(s->heap, s->nitems);
	s->nitems++;
	if (s->nitems > s->max_items)
		s->max_items = s->nitems;
}

static AmrKnnItem
pop(AmrKnnSearch *s)
{
	AmrKnnItem	top = s->heap[0];

	s->nitems--;
	if (s->nitems > 0)
	{
		s->heap[0] = s->heap[s->nitems];
		sift_down(s->heap, s->nitems, 0);
	}
	return top;
}

static void
push_node(AmrKnnSearch *s, uint32_t node, double bound)
{
	push(s, bound, AMR_KNN_ORDER_TREE | (s->next_order++ & AMR_KNN_SEQ_MASK), node);
}

static void
push_leaf(AmrKnnSearch *s, uint32_t leaf_id, double bound, uint64_t split_stamp)
{
	uint64_t	delta = 0;

	if (split_stamp > s->split_base)
		delta = split_stamp - s->split_base;

	/*
	 * Every split since split_base took a new leaf id, and leaf ids are only
	 * released when the tree is dropped, so fewer than AMR_MAX_SLOTS (2^30)
	 * splits can separate two stamps of one search: the delta fits.
	 */
	if (delta > UINT32_MAX)
		delta = UINT32_MAX;
	push(s, bound, AMR_KNN_ORDER_TREE | AMR_KNN_ORDER_FLAG |
		 (s->next_order++ & AMR_KNN_SEQ_MASK),
		 (uint64_t) leaf_id | (delta << 32));
}

void
amr_knn_init(AmrKnnSearch *s, AmrReallocFn realloc_fn, void *realloc_arg)
{
	memset(s, 0, sizeof(*s));
	s->realloc_fn = realloc_fn;
	s->realloc_arg = realloc_arg;
}

void
amr_knn_begin(AmrKnnSearch *s, const AmrStore *store, const AmrTree *tree,
			  const AmrPoint *query)
{
	AmrBox		b = {query->x, query->y, query->x, query->y};

	amr_knn_begin_box(s, store, tree, &b);
}

void
amr_knn_begin_box(AmrKnnSearch *s, const AmrStore *store, const AmrTree *tree,
				  const AmrBox *query)
{
	s->nitems = 0;
	s->store = store;
	s->tree = tree;
	s->query = *query;
	s->lossy = false;
	s->bound_fn = NULL;
	s->bound_arg = NULL;
	s->tree_read = false;
	s->inner_nodes_seen = 0;
	s->split_base = 0;
	s->next_order = 0;
	s->returned_any = false;
	s->last_distance = 0.0;
	s->nreturned = 0;
	s->nreturned_sorted = 0;
	s->drop_returned = false;
	s->nodes_expanded = 0;
	s->leaves_returned = 0;
	s->entries_added = 0;
	s->entries_returned = 0;
	s->entries_dropped = 0;
	s->entries_late = 0;
	s->restarts = 0;
	s->max_items = 0;
}

void
amr_knn_set_lossy(AmrKnnSearch *s, bool lossy)
{
	s->lossy = lossy;
}

void
amr_knn_set_bound_fn(AmrKnnSearch *s, AmrKnnBoundFn fn, void *arg)
{
	s->bound_fn = fn;
	s->bound_arg = arg;
}

double
amr_knn_box_bound(const AmrKnnSearch *s, const AmrFBox *b)
{
	double		bound;

	if (s->bound_fn)
		return s->bound_fn(b, &s->query, s->bound_arg);
	bound = amr_fbox_box_lower_bound(b, &s->query);

	return s->lossy ? amr_lossy_lower_bound(bound, b, &s->query) : bound;
}

/*
 * Queue the root of the box side, noting the tree's inner-node count (to
 * detect inner splits later) and, the first time, its split counter (the
 * base of leaf items' stamps).  Tree lock held.
 */
static void
read_root(AmrKnnSearch *s)
{
	uint32_t	root = s->tree->root;

	s->inner_nodes_seen = __atomic_load_n(&s->tree->ninner, __ATOMIC_ACQUIRE);
	s->inner_epoch_seen = __atomic_load_n(&s->tree->inner_epoch, __ATOMIC_ACQUIRE);
	if (!s->tree_read)
		s->split_base = __atomic_load_n(&s->tree->nsn, __ATOMIC_ACQUIRE);
	s->tree_read = true;
	/* bound 0: the root is the first thing expanded anyway */
	if (root != AMR_INVALID_NODE)
		push_node(s, root, 0.0);
}

/* Move a[root] down the max-heap a[0..n) until both children are smaller. */
static void
seq_sift_down(uint64_t *a, size_t root, size_t n)
{
	for (;;)
	{
		size_t		child = 2 * root + 1;
		uint64_t	tmp;

		if (child >= n)
			break;
		if (child + 1 < n && a[child + 1] > a[child])
			child++;
		if (a[root] >= a[child])
			break;
		tmp = a[root];
		a[root] = a[child];
		a[child] = tmp;
		root = child;
	}
}

/* In-place heapsort: restarts are rare, but qsort() may call malloc(). */
static void
sort_seqs(uint64_t *a, size_t n)
{
	size_t		end,
				start;

	for (start = n / 2; start-- > 0;)
		seq_sift_down(a, start, n);
	for (end = n; end > 1; end--)
	{
		uint64_t	tmp = a[0];

		a[0] = a[end - 1];
		a[end - 1] = tmp;
		seq_sift_down(a, 0, end - 1);
	}
}

/*
 * An inner node was split since the queued nodes were read: some of their
 * children may now hang below a sibling the queue does not know.  Or the
 * nodes were packed again (a standby's replay left them stale): the queued
 * node ids name freed nodes.  Start over from the root; what was returned
 * already is dropped as it is fed again (see amr_knn_add_entry), which
 * needs the seqs returned sorted.  Tree lock held.
 */
static void
restart_from_root(AmrKnnSearch *s)
{
	s->nitems = 0;
	s->restarts++;
	if (s->returned_any)
	{
		s->drop_returned = true;
		sort_seqs(s->returned, s->nreturned);
		s->nreturned_sorted = s->nreturned;
	}
	read_root(s);
}

/*
 * Remember the seq of an entry returned.  Every seq, not only those at the
 * last distance: a restart cannot take "closer than the last entry
 * returned" for "returned".  The distances fed for a lossy class are lower
 * bounds, and an entry's bound can be below its leaf's by the rounding and
 * fuzz allowances of amr_gap_lower_bound (its leaf's box contains the query's
 * x, so the leaf gets the exact gap, while the entry's box does not and gets
 * hypot(dx, dy) * (1 - 2^-48)): such an entry, in a leaf still queued at the
 * restart, was never returned, and dropping it lost the row.
 */
static void
note_returned(AmrKnnSearch *s, double distance, uint64_t seq)
{
	s->returned_any = true;
	s->last_distance = distance;
	if (s->nreturned == s->returned_capacity)
	{
		size_t		newcap = s->returned_capacity ? s->returned_capacity * 2 : 64;

		s->returned = s->realloc_fn(s->returned, newcap * sizeof(uint64_t), s->realloc_arg);
		s->returned_capacity = newcap;
	}
	s->returned[s->nreturned++] = seq;
}

/* Was seq returned before the last restart? */
static bool
returned_before_restart(const AmrKnnSearch *s, uint64_t seq)
{
	size_t		lo = 0,
				hi = s->nreturned_sorted;

	while (lo < hi)
	{
		size_t		mid = lo + (hi - lo) / 2;

		if (s->returned[mid] < seq)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < s->nreturned_sorted && s->returned[lo] == seq;
}

/* Queue the children of an inner node with their bounds.  Tree lock held. */
static void
expand_node(AmrKnnSearch *s, uint32_t node_id)
{
	const AmrInnerNode *n = &s->store->nodes[node_id];
	int			count = n->count;
	int			i;

	s->nodes_expanded++;
	if (n->level == 1)
	{
		/* the leaf ids are read now: that is the moment their stamp names */
		uint64_t	stamp = __atomic_load_n(&s->tree->nsn, __ATOMIC_ACQUIRE);

		for (i = 0; i < count; i++)
		{
			AmrFBox		b = amr_node_entry_box(n, i);

			push_leaf(s, n->child[i], amr_knn_box_bound(s, &b), stamp);
		}
	}
	else
	{
		for (i = 0; i < count; i++)
		{
			AmrFBox		b = amr_node_entry_box(n, i);

			push_node(s, n->child[i], amr_knn_box_bound(s, &b));
		}
	}
}

bool
amr_knn_next_reads_tree(const AmrKnnSearch *s)
{
	return !s->tree_read || (s->nitems > 0 && is_node(&s->heap[0]));
}

AmrKnnStep
amr_knn_next(AmrKnnSearch *s, AmrKnnResult *out)
{
	if (!s->tree_read)
		read_root(s);

	while (s->nitems > 0)
	{
		const AmrKnnItem *top = &s->heap[0];
		AmrKnnItem	it;

		if (is_node(top) &&
			(__atomic_load_n(&s->tree->ninner, __ATOMIC_ACQUIRE) !=
			 s->inner_nodes_seen ||
			 __atomic_load_n(&s->tree->inner_epoch, __ATOMIC_ACQUIRE) !=
			 s->inner_epoch_seen))
		{
			restart_from_root(s);
			continue;
		}

		it = pop(s);
		if (is_entry(&it) && (it.order & AMR_KNN_ORDER_BOUND))
		{
			/* not returned: the caller computes and feeds its distance */
			out->distance = it.key;
			out->recheck = false;
			out->seq = it.order & AMR_KNN_SEQ_MASK;
			out->payload = it.ref;
			out->leaf_id = AMR_INVALID_LEAF;
			out->split_stamp = 0;
			return AMR_KNN_REFINE;
		}
		if (is_entry(&it))
		{
			out->distance = it.key;
			out->recheck = (it.order & AMR_KNN_ORDER_FLAG) != 0;
			out->seq = it.order & AMR_KNN_SEQ_MASK;
			out->payload = it.ref;
			out->leaf_id = AMR_INVALID_LEAF;
			out->split_stamp = 0;
			note_returned(s, it.key, out->seq);
			s->entries_returned++;
			return AMR_KNN_ENTRY;
		}
		if (is_leaf(&it))
		{
			out->distance = it.key;
			out->recheck = false;
			out->seq = 0;
			out->payload = 0;
			out->leaf_id = (uint32_t) it.ref;
			out->split_stamp = s->split_base + (it.ref >> 32);
			s->leaves_returned++;
			return AMR_KNN_LEAF;
		}
		expand_node(s, (uint32_t) it.ref);
	}
	return AMR_KNN_DONE;
}

void
amr_knn_add_entry(AmrKnnSearch *s, double distance, uint64_t seq,
				  uint64_t payload, bool recheck)
{
	seq &= AMR_KNN_SEQ_MASK;
	/* after a restart: fed again, and returned in an earlier pass */
	if (s->drop_returned && returned_before_restart(s, seq))
	{
		s->entries_dropped++;
		return;
	}

	/*
	 * Fed closer than the last entry returned: its leaf's bound did not hold
	 * for it (an entry inserted after the scan started, or a lossy bound
	 * below its leaf's, see note_returned).  It is still returned, late, and
	 * counted.
	 */
	if (s->returned_any && amr_float8_lt(distance, s->last_distance))
		s->entries_late++;
	s->entries_added++;
	push(s, distance, seq | (recheck ? AMR_KNN_ORDER_FLAG : 0), payload);
}

void
amr_knn_add_entry_bound(AmrKnnSearch *s, double bound, uint64_t seq, uint64_t payload)
{
	/*
	 * No late or already-returned check here: a bound below the last distance
	 * returned says nothing about the distance.  Those checks run when the
	 * entry is fed again with its distance.
	 */
	s->entries_added++;
	push(s, bound, (seq & AMR_KNN_SEQ_MASK) | AMR_KNN_ORDER_BOUND, payload);
}

void
amr_knn_add_leaf(AmrKnnSearch *s, uint32_t leaf_id, double bound,
				 uint64_t split_stamp)
{
	push_leaf(s, leaf_id, bound, split_stamp);
}
