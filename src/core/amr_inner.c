/*-------------------------------------------------------------------------
 *
 * amr_inner.c
 *		Inner nodes: allocation from the DRAM arena, descent, enlargement,
 *		split propagation and candidate collection for scans.
 *
 * Inner nodes are never persisted: they are rebuilt from the Leaf Table
 * after any restart (papers 000 and 001: leaf-only flushing).  Level-1 nodes
 * hold logical leaf ids, never leaf addresses, so moving a leaf between tiers
 * never touches them.
 *
 * Concurrency (enforced by the caller): descents and collections run under
 * the tree lock in shared mode; a descent may widen boxes concurrently with
 * other readers, using atomic min/max on the float bits, so a reader sees
 * either the old or a wider box, never a narrower one.  Anything that adds,
 * removes or narrows an entry runs under the tree lock in exclusive mode.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_tree.h"

#include <math.h>
#include <string.h>

AmrStatus
amr_node_alloc(AmrStore *s, uint32_t *node_out, int level)
{
	int64_t		n = amr_bitmap_alloc(s->nodes_used);
	AmrInnerNode *node;

	if (n < 0)
		return AMR_ERR_DRAM_FULL;
	node = &s->nodes[n];
	node->count = 0;
	node->level = (uint16_t) level;
	node->reserved = 0;
	*node_out = (uint32_t) n;
	return AMR_OK;
}

void
amr_node_free(AmrStore *s, uint32_t node)
{
	amr_bitmap_clear(s->nodes_used, node);
}

AmrFBox
amr_node_union(const AmrInnerNode *n)
{
	AmrFBox		acc = amr_fbox_empty();
	int			i;

	for (i = 0; i < n->count; i++)
	{
		if (n->xlo[i] < acc.xlo)
			acc.xlo = n->xlo[i];
		if (n->ylo[i] < acc.ylo)
			acc.ylo = n->ylo[i];
		if (n->xhi[i] > acc.xhi)
			acc.xhi = n->xhi[i];
		if (n->yhi[i] > acc.yhi)
			acc.yhi = n->yhi[i];
	}
	return acc;
}

static inline uint32_t *
root_ref(AmrTree *t, bool nulls)
{
	return nulls ? &t->null_root : &t->root;
}

static inline uint32_t *
height_ref(AmrTree *t, bool nulls)
{
	return nulls ? &t->null_height : &t->height;
}

void
amr_tree_descriptor_init(AmrTree *t, uint32_t tree_no, const AmrTreeRecord *rec)
{
	memset(t, 0, sizeof(*t));
	t->tree_no = tree_no;
	t->root = AMR_INVALID_NODE;
	t->null_root = AMR_INVALID_NODE;
	t->tiering = true;
	if (rec != NULL)
	{
		t->generation = rec->generation;
		t->budget_kind = rec->budget_kind;
		t->budget_value = rec->budget_value;
		t->tiering = !rec->tiering_off;
	}
}

AmrStatus
amr_tree_init_empty(AmrStore *s, AmrTree *t)
{
	uint32_t	root;
	uint32_t	null_root;

	if (amr_node_alloc(s, &root, 1) != AMR_OK)
		return AMR_ERR_DRAM_FULL;
	if (amr_node_alloc(s, &null_root, 1) != AMR_OK)
	{
		amr_node_free(s, root);
		return AMR_ERR_DRAM_FULL;
	}
	t->root = root;
	t->height = 1;
	t->null_root = null_root;
	t->null_height = 1;
	amr_counter_set(&t->ninner, 2);
	return AMR_OK;
}

static void
free_subtree(AmrStore *s, uint32_t node)
{
	AmrInnerNode *n = &s->nodes[node];
	int			i;

	if (n->level > 1)
		for (i = 0; i < n->count; i++)
			free_subtree(s, n->child[i]);
	amr_node_free(s, node);
}

void
amr_tree_free_nodes(AmrStore *s, AmrTree *t)
{
	if (t->root != AMR_INVALID_NODE)
		free_subtree(s, t->root);
	if (t->null_root != AMR_INVALID_NODE)
		free_subtree(s, t->null_root);
	t->root = AMR_INVALID_NODE;
	t->null_root = AMR_INVALID_NODE;
	t->height = 0;
	t->null_height = 0;
	amr_counter_set(&t->ninner, 0);
	__atomic_add_fetch(&t->inner_epoch, 1, __ATOMIC_RELEASE);
}

/* plain comparisons compile to minss/maxss; fminf/fmaxf would be calls */
static inline float
minf(float a, float b)
{
	return a < b ? a : b;
}

static inline float
maxf(float a, float b)
{
	return a > b ? a : b;
}

/*
 * Choose the child to descend into.  Most boxes fall inside an existing
 * entry (zero enlargement): the first pass finds the smallest entry that
 * contains the box.  Otherwise: least area enlargement, then least margin
 * enlargement (which separates candidates when the data are points or lines
 * and every area is zero), then least area.
 *
 * Both passes compute into small arrays without branches, over the
 * structure-of-arrays node, so that they vectorise and do not suffer branch
 * mispredictions.  Infinite boxes may produce NaN areas or enlargements;
 * NaN never compares smaller, so such entries simply do not attract the
 * box (this only steers the heuristic, never correctness).
 */
static int
choose_entry(const AmrInnerNode *n, const AmrFBox *b)
{
	float		key[AMR_INNER_FANOUT];
	float		enl[AMR_INNER_FANOUT];
	float		menl[AMR_INNER_FANOUT];
	float		area[AMR_INNER_FANOUT];
	const int	count = n->count;
	const float bxlo = b->xlo,
				bylo = b->ylo,
				bxhi = b->xhi,
				byhi = b->yhi;
	float		best_key = INFINITY;
	int			best = -1;
	int			i;

	for (i = 0; i < count; i++)
	{
		float		a = (n->xhi[i] - n->xlo[i]) * (n->yhi[i] - n->ylo[i]);
		int			inside = (n->xlo[i] <= bxlo) & (n->ylo[i] <= bylo) &
		(n->xhi[i] >= bxhi) & (n->yhi[i] >= byhi);

		area[i] = a;
		key[i] = inside ? a : INFINITY;
	}
	for (i = 0; i < count; i++)
	{
		if (key[i] < best_key)
		{
			best_key = key[i];
			best = i;
		}
	}
	if (best >= 0)
		return best;

	for (i = 0; i < count; i++)
	{
		float		w = n->xhi[i] - n->xlo[i];
		float		h = n->yhi[i] - n->ylo[i];
		float		uw = maxf(n->xhi[i], bxhi) - minf(n->xlo[i], bxlo);
		float		uh = maxf(n->yhi[i], byhi) - minf(n->ylo[i], bylo);

		enl[i] = uw * uh - area[i];
		menl[i] = (uw + uh) - (w + h);
	}
	best = 0;
	for (i = 1; i < count; i++)
	{
		if (enl[i] < enl[best] ||
			(enl[i] == enl[best] && (menl[i] < menl[best] ||
									 (menl[i] == menl[best] && area[i] < area[best]))))
			best = i;
	}
	return best;
}

uint32_t
amr_choose_leaf(const AmrStore *s, const AmrTree *t, bool nulls,
				const AmrFBox *b, AmrPath *path)
{
	uint32_t	node = nulls ? t->null_root : t->root;

	path->depth = 0;
	if (node == AMR_INVALID_NODE)
		return AMR_INVALID_LEAF;
	for (;;)
	{
		const AmrInnerNode *n = &s->nodes[node];
		int			i;

		if (n->count == 0)
			return AMR_INVALID_LEAF;
		i = choose_entry(n, b);
		path->node[path->depth] = node;
		path->idx[path->depth] = (uint16_t) i;
		path->depth++;
		if (n->level == 1)
			return n->child[i];
		node = n->child[i];
	}
}

/* Depth-first search below node for the level-1 entry of leaf_id. */
static bool
find_leaf_below(const AmrStore *s, uint32_t node, bool nulls, uint32_t leaf_id,
				const AmrFBox *box, AmrPath *path)
{
	const AmrInnerNode *n = &s->nodes[node];
	int			d = path->depth;
	int			i;

	if (d >= AMR_MAX_HEIGHT)
		return false;
	path->node[d] = node;
	path->depth = d + 1;
	for (i = 0; i < n->count; i++)
	{
		AmrFBox		eb = amr_node_entry_box(n, i);

		/* the NULL side's boxes are all empty: search it all */
		if (!nulls && !amr_fbox_covers(&eb, box))
			continue;
		path->idx[d] = (uint16_t) i;
		if (n->level == 1)
		{
			if (n->child[i] == leaf_id)
				return true;
		}
		else if (find_leaf_below(s, n->child[i], nulls, leaf_id, box, path))
			return true;
	}
	path->depth = d;
	return false;
}

bool
amr_find_leaf_path(const AmrStore *s, const AmrTree *t, bool nulls, uint32_t leaf_id,
				   const AmrFBox *box, AmrPath *path)
{
	uint32_t	root = nulls ? t->null_root : t->root;

	path->depth = 0;
	if (root == AMR_INVALID_NODE)
		return false;
	return find_leaf_below(s, root, nulls, leaf_id, box, path);
}

/* Atomically lower *p to v if v is smaller (or raise, for the max variant). */
static void
atomic_float_min(float *p, float v)
{
	uint32_t   *u = (uint32_t *) p;
	uint32_t	old = amr_counter_read(u);

	for (;;)
	{
		float		cur;
		uint32_t	nv;

		memcpy(&cur, &old, sizeof(cur));
		if (!(v < cur))
			return;
		memcpy(&nv, &v, sizeof(nv));
		if (__atomic_compare_exchange_n(u, &old, nv, false,
										__ATOMIC_RELEASE, __ATOMIC_RELAXED))
			return;
	}
}

static void
atomic_float_max(float *p, float v)
{
	uint32_t   *u = (uint32_t *) p;
	uint32_t	old = amr_counter_read(u);

	for (;;)
	{
		float		cur;
		uint32_t	nv;

		memcpy(&cur, &old, sizeof(cur));
		if (!(v > cur))
			return;
		memcpy(&nv, &v, sizeof(nv));
		if (__atomic_compare_exchange_n(u, &old, nv, false,
										__ATOMIC_RELEASE, __ATOMIC_RELAXED))
			return;
	}
}

int
amr_path_nodes_to_enlarge(const AmrStore *s, const AmrPath *path,
						  const AmrFBox *b, uint32_t *nodes)
{
	int			d;
	int			n = 0;

	for (d = 0; d < path->depth; d++)
	{
		const AmrInnerNode *node = &s->nodes[path->node[d]];
		AmrFBox		e = amr_node_entry_box(node, path->idx[d]);

		if (!amr_fbox_covers(&e, b))
			nodes[n++] = path->node[d];
	}
	return n;
}

void
amr_path_enlarge(AmrStore *s, const AmrPath *path, const AmrFBox *b)
{
	int			d;

	for (d = 0; d < path->depth; d++)
	{
		AmrInnerNode *n = &s->nodes[path->node[d]];
		int			i = path->idx[d];

		atomic_float_min(&n->xlo[i], b->xlo);
		atomic_float_min(&n->ylo[i], b->ylo);
		atomic_float_max(&n->xhi[i], b->xhi);
		atomic_float_max(&n->yhi[i], b->yhi);
	}
}

static uint32_t
take_spare(uint32_t *spare_nodes)
{
	int			i;

	for (i = 0; i <= AMR_MAX_HEIGHT; i++)
	{
		if (spare_nodes[i] != AMR_INVALID_NODE)
		{
			uint32_t	n = spare_nodes[i];

			spare_nodes[i] = AMR_INVALID_NODE;
			return n;
		}
	}
	return AMR_INVALID_NODE;	/* caller reserved too few: cannot happen */
}

/*
 * Insert (box, child) into node, which is full: split it with the R*
 * heuristic into node and a new node taken from the spares.
 */
static uint32_t
split_inner(AmrStore *s, uint32_t node_id, const AmrFBox *box, uint32_t child,
			uint32_t *spare_nodes)
{
	AmrInnerNode *n = &s->nodes[node_id];
	int			total = n->count + 1;
	AmrFBox		boxes[AMR_INNER_FANOUT + 1];
	uint32_t	children[AMR_INNER_FANOUT + 1];
	uint8_t		goes_right[AMR_INNER_FANOUT + 1];
	uint32_t	right_id = take_spare(spare_nodes);
	AmrInnerNode *r = &s->nodes[right_id];
	int			i;

	for (i = 0; i < n->count; i++)
	{
		boxes[i] = amr_node_entry_box(n, i);
		children[i] = n->child[i];
	}
	boxes[total - 1] = *box;
	children[total - 1] = child;
	amr_rstar_split(boxes, total, AMR_INNER_FANOUT * 2 / 5, goes_right);

	r->level = n->level;
	r->count = 0;
	n->count = 0;
	for (i = 0; i < total; i++)
	{
		AmrInnerNode *dst = goes_right[i] ? r : n;

		amr_node_set_entry(dst, dst->count, &boxes[i], children[i]);
		dst->count++;
	}
	return right_id;
}

static void
log_split(AmrNodeSplits *log, uint32_t from, uint32_t to)
{
	if (log != NULL && log->n < AMR_MAX_HEIGHT + 1)
	{
		log->from[log->n] = from;
		log->to[log->n] = to;
		log->n++;
	}
}

void
amr_apply_leaf_split(AmrStore *s, AmrTree *t, bool nulls, const AmrPath *path,
					 const AmrFBox *left_box, uint32_t right_leaf,
					 const AmrFBox *right_box, uint32_t *spare_nodes,
					 AmrNodeSplits *log)
{
	int			d = path->depth - 1;
	uint32_t	carry_child = right_leaf;
	AmrFBox		carry_box = *right_box;
	bool		carry = true;
	uint64_t	new_nodes = 0;

	/* the old leaf keeps its slot in the level-1 node, with its new box */
	amr_node_set_entry(&s->nodes[path->node[d]], path->idx[d], left_box,
					   s->nodes[path->node[d]].child[path->idx[d]]);

	for (; d >= 0; d--)
	{
		uint32_t	node_id = path->node[d];
		AmrInnerNode *n = &s->nodes[node_id];
		uint32_t	new_sibling = AMR_INVALID_NODE;

		if (carry)
		{
			if (n->count < AMR_INNER_FANOUT)
			{
				amr_node_set_entry(n, n->count, &carry_box, carry_child);
				n->count++;
				carry = false;
			}
			else
			{
				new_sibling = split_inner(s, node_id, &carry_box, carry_child,
										  spare_nodes);
				log_split(log, node_id, new_sibling);
				new_nodes++;
			}
		}

		if (d > 0)
		{
			/* refresh this node's box in its parent */
			AmrInnerNode *p = &s->nodes[path->node[d - 1]];
			AmrFBox		u = amr_node_union(n);

			amr_node_set_entry(p, path->idx[d - 1], &u, node_id);
			if (new_sibling != AMR_INVALID_NODE)
			{
				carry_child = new_sibling;
				carry_box = amr_node_union(&s->nodes[new_sibling]);
				carry = true;
			}
		}
		else if (new_sibling != AMR_INVALID_NODE)
		{
			/* the root split: grow the tree by one level */
			uint32_t	new_root = take_spare(spare_nodes);
			AmrInnerNode *r = &s->nodes[new_root];
			AmrFBox		u1 = amr_node_union(n);
			AmrFBox		u2 = amr_node_union(&s->nodes[new_sibling]);

			r->level = n->level + 1;
			r->count = 2;
			amr_node_set_entry(r, 0, &u1, node_id);
			amr_node_set_entry(r, 1, &u2, new_sibling);
			*root_ref(t, nulls) = new_root;
			(*height_ref(t, nulls))++;
			log_split(log, node_id, new_root);
			new_nodes++;
		}
	}
	amr_counter_add(&t->ninner, new_nodes);
}

void
amr_add_first_leaf(AmrStore *s, AmrTree *t, bool nulls, uint32_t leaf_id,
				   const AmrFBox *box)
{
	AmrInnerNode *root = &s->nodes[*root_ref(t, nulls)];

	amr_node_set_entry(root, 0, box, leaf_id);
	root->count = 1;
}

void
amr_leaf_list_push(AmrLeafList *out, uint32_t id, AmrReallocFn realloc_fn,
				   void *arg)
{
	if (out->n == out->cap)
	{
		uint32_t	newcap = out->cap ? out->cap * 2 : 64;

		out->ids = realloc_fn(out->ids, (size_t) newcap * sizeof(uint32_t), arg);
		out->cap = newcap;
	}
	out->ids[out->n++] = id;
}

static inline bool
entry_matches(const AmrInnerNode *n, int i, const AmrScanKey *keys, int nkeys)
{
	AmrFBox		b = amr_node_entry_box(n, i);
	int			k;

	for (k = 0; k < nkeys; k++)
		if (keys[k].prune && !amr_inner_match(keys[k].strategy, &b, &keys[k].query))
			return false;
	return true;
}

/*
 * The common search -- one `&&` or `<@` key without NaN -- tests a node's
 * entries in one branch-free pass of float comparisons over its
 * structure-of-arrays boxes, which GCC vectorises.  amr_inner_match decides
 * "(double) f <= q + eps" and "q <= (double) f + eps" for each float bound
 * f; both sides are monotone in f, so each is "f <= t" or "f >= t" for one
 * float threshold t, found once per search (overlap_thresholds), and the
 * pass gives exactly amr_inner_match's answer.  A spatial join's rescans
 * spent a third of their time in this test before.
 */
typedef struct OverlapThresholds
{
	float		xlo_max;		/* xlo[i] <= xlo_max */
	float		xhi_min;		/* xhi[i] >= xhi_min */
	float		ylo_max;
	float		yhi_min;
} OverlapThresholds;

static inline bool
single_overlap_key(const AmrScanKey *keys, int nkeys)
{
	return nkeys == 1 && keys[0].prune &&
		(keys[0].strategy == AMR_STRAT_OVERLAP || keys[0].strategy == AMR_STRAT_CONTAINED_BY);
}

/*
 * Floats in order as unsigned integers (NaNs fall outside the range from
 * -Infinity to +Infinity), so that a threshold is a binary search of at
 * most 32 steps whatever the float spacing near it.
 */
static inline uint32_t
float_order_key(float f)
{
	uint32_t	u;

	memcpy(&u, &f, sizeof(u));
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline float
float_from_order_key(uint32_t k)
{
	uint32_t	u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
	float		f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/*
 * The boundary of a predicate that holds for every float up to some point
 * (below_holds) or from some point on (!below_holds): the order key of the
 * last float where it holds, or of the first.  A few steps from the guess
 * (the nearest float to where the boundary is) settle nearly every search;
 * a binary search over the order keys settles the rest, where floats are
 * denser than the epsilon (near zero).
 */
typedef bool (*FloatPredicate) (float f, double q);

static bool
bound_le_query(float f, double q)
{
	return amr_fp_le(f, q);
}

static bool
query_le_bound(float f, double q)
{
	return amr_fp_le(q, f);
}

static uint32_t
float_boundary(FloatPredicate pred, double q, bool below_holds, double guess)
{
	uint32_t	lo = float_order_key(-INFINITY);
	uint32_t	hi = float_order_key(INFINITY);
	uint32_t	g;
	int			step;

	/* an edge of the range: the predicate holds everywhere */
	if (pred(below_holds ? INFINITY : -INFINITY, q))
		return below_holds ? hi : lo;
	/* lo..hi brackets the change: pred(lo) != pred(hi) */
	g = float_order_key(isnan(guess) ? 0.0f : (float) guess);
	for (step = 0; step < 4 && g > lo && g < hi; step++)
	{
		bool		at = pred(float_from_order_key(g), q);
		bool		next = pred(float_from_order_key(g + 1), q);

		if (at != next)
			return below_holds ? g : g + 1;
		/* both on the same side of the change: move toward it */
		if (at == below_holds)
			g++;
		else
			g--;
	}
	while (hi - lo > 1)
	{
		uint32_t	mid = lo + (hi - lo) / 2;

		if (pred(float_from_order_key(mid), q) == below_holds)
			lo = mid;
		else
			hi = mid;
	}
	return below_holds ? lo : hi;
}

/* The largest float f with amr_fp_le(f, q) (q is not NaN). */
static float
le_threshold(double q)
{
	return float_from_order_key(float_boundary(bound_le_query, q, true, q + AMR_EPSILON));
}

/* The smallest float f with amr_fp_le(q, f) (q is not NaN). */
static float
ge_threshold(double q)
{
	return float_from_order_key(float_boundary(query_le_bound, q, false, q - AMR_EPSILON));
}

static void
overlap_thresholds(const AmrBox *q, OverlapThresholds *th)
{
	th->xlo_max = le_threshold(q->xhi);
	th->xhi_min = ge_threshold(q->xlo);
	th->ylo_max = le_threshold(q->yhi);
	th->yhi_min = ge_threshold(q->ylo);
}

static void
overlap_hits(const AmrInnerNode *n, const OverlapThresholds *th, int32_t *hit)
{
	const float xlo_max = th->xlo_max;
	const float xhi_min = th->xhi_min;
	const float ylo_max = th->ylo_max;
	const float yhi_min = th->yhi_min;
	int			count = n->count;
	int			i;

	for (i = 0; i < count; i++)
		hit[i] = (n->xlo[i] <= xlo_max) & (n->xhi[i] >= xhi_min) &
			(n->ylo[i] <= ylo_max) & (n->yhi[i] >= yhi_min);
}

void
amr_collect_leaves(const AmrStore *s, const AmrTree *t, bool nulls,
				   const AmrScanKey *keys, int nkeys, AmrLeafList *out,
				   AmrVisitFn visit, void *visit_arg,
				   AmrReallocFn realloc_fn, void *realloc_arg)
{
	uint32_t	stack[AMR_MAX_HEIGHT * AMR_INNER_FANOUT];
	int			sp = 0;
	uint32_t	root = nulls ? t->null_root : t->root;
	bool		fast = single_overlap_key(keys, nkeys);
	OverlapThresholds th;
	int32_t		hit[AMR_INNER_FANOUT];

	if (root == AMR_INVALID_NODE)
		return;
	if (fast)
		overlap_thresholds(&keys[0].query, &th);
	stack[sp++] = root;
	while (sp > 0)
	{
		uint32_t	node_id = stack[--sp];
		const AmrInnerNode *n = &s->nodes[node_id];
		int			i;

		if (visit != NULL)
			visit(node_id, visit_arg);

		if (fast)
			overlap_hits(n, &th, hit);
		else
			for (i = 0; i < n->count; i++)
				hit[i] = entry_matches(n, i, keys, nkeys);

		if (n->level == 1)
		{
			for (i = 0; i < n->count; i++)
				if (hit[i])
					amr_leaf_list_push(out, n->child[i], realloc_fn, realloc_arg);
		}
		else
		{
			/* push in reverse so children are visited in order */
			for (i = n->count - 1; i >= 0; i--)
				if (hit[i])
					stack[sp++] = n->child[i];
		}
	}
}

uint64_t
amr_count_leaves(const AmrStore *s, const AmrTree *t, const AmrScanKey *keys,
				 int nkeys)
{
	uint32_t	stack[AMR_MAX_HEIGHT * AMR_INNER_FANOUT];
	int			sp = 0;
	uint64_t	count = 0;

	if (t->root == AMR_INVALID_NODE)
		return 0;
	stack[sp++] = t->root;
	while (sp > 0)
	{
		const AmrInnerNode *n = &s->nodes[stack[--sp]];
		int			i;

		for (i = 0; i < n->count; i++)
		{
			if (!entry_matches(n, i, keys, nkeys))
				continue;
			if (n->level == 1)
				count++;
			else
				stack[sp++] = n->child[i];
		}
	}
	return count;
}
