/*-------------------------------------------------------------------------
 *
 * amr_pack.c
 *		Sort-Tile-Recursive packing for bulk builds and rebuilds, and the
 *		R*-tree split heuristic.
 *
 * STR (Leutenegger et al.) sorts by x, cuts into sqrt(P) vertical slices,
 * sorts each slice by y and cuts runs of one node each.  It gives near-100%
 * utilisation and little overlap, and it is what makes a build a sort plus a
 * sequential write instead of one insertion per row.  The sorts are LSD radix
 * sorts on 64-bit keys, so packing is linear in the number of items.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_tree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Map a double to a uint64 with the same order (no NaN reaches here). */
static inline uint64_t
sortable_bits(double d)
{
	uint64_t	u;

	memcpy(&u, &d, sizeof(u));
	return (u & UINT64_C(0x8000000000000000)) ? ~u : (u | UINT64_C(0x8000000000000000));
}

static inline uint64_t
item_key(const AmrPackItem *it, int axis)
{
	return sortable_bits(axis == 0 ? amr_fbox_center_x(&it->box)
						 : amr_fbox_center_y(&it->box));
}

static void
insertion_sort(AmrPackItem *items, size_t n, int axis)
{
	size_t		i;

	for (i = 1; i < n; i++)
	{
		AmrPackItem tmp = items[i];
		uint64_t	k = item_key(&tmp, axis);
		size_t		j = i;

		while (j > 0 && item_key(&items[j - 1], axis) > k)
		{
			items[j] = items[j - 1];
			j--;
		}
		items[j] = tmp;
	}
}

/*
 * LSD radix sort by the center coordinate on one axis, 11 bits per pass
 * (6 passes); scratch holds n items.  One read of the items counts every
 * pass's digits; passes whose digit is constant are skipped, which is most
 * of them (a float box's centre has at most 25 significant bits, and
 * clustered data shares its top bits).  The counts are thread-local (the
 * core does not assume one thread) and reached through one pointer: in a
 * shared library each thread-local access may be a call.
 */
static void
radix_sort(AmrPackItem *items, size_t n, int axis, AmrPackItem *scratch)
{
	enum
	{
		BITS = 11, BUCKETS = 1 << BITS, PASSES = (64 + BITS - 1) / BITS
	};
	static __thread size_t tls_counts[PASSES][BUCKETS];
	size_t		(*counts)[BUCKETS] = tls_counts;
	AmrPackItem *src = items;
	AmrPackItem *dst = scratch;
	size_t		i;
	int			pass;

	if (n < 256)
	{
		insertion_sort(items, n, axis);
		return;
	}
	memset(counts, 0, sizeof(tls_counts));
	for (i = 0; i < n; i++)
	{
		uint64_t	key = item_key(&src[i], axis);

		for (pass = 0; pass < PASSES; pass++)
			counts[pass][(key >> (pass * BITS)) & (BUCKETS - 1)]++;
	}
	for (pass = 0; pass < PASSES; pass++)
	{
		int			shift = pass * BITS;
		size_t	   *cnt = counts[pass];
		size_t		sum = 0;
		bool		constant = false;

		for (i = 0; i < BUCKETS; i++)
		{
			size_t		c = cnt[i];

			if (c == n)
				constant = true;
			cnt[i] = sum;
			sum += c;
		}
		if (constant)
			continue;
		for (i = 0; i < n; i++)
		{
			uint64_t	digit = (item_key(&src[i], axis) >> shift) & (BUCKETS - 1);

			dst[cnt[digit]++] = src[i];
		}
		{
			AmrPackItem *t = src;

			src = dst;
			dst = t;
		}
	}
	if (src != items)
		memcpy(items, src, n * sizeof(AmrPackItem));
}

size_t
amr_str_slice_items(size_t n, size_t per_group)
{
	size_t		groups;

	if (n <= per_group || per_group == 0)
		return n;
	groups = (n + per_group - 1) / per_group;
	return (size_t) ceil(sqrt((double) groups)) * per_group;
}

void
amr_str_order(AmrPackItem *items, size_t n, size_t per_group,
			  AmrPackItem *scratch)
{
	size_t		slice_items;
	size_t		start;

	if (n <= per_group || per_group == 0)
		return;
	slice_items = amr_str_slice_items(n, per_group);
	radix_sort(items, n, 0, scratch);
	for (start = 0; start < n; start += slice_items)
	{
		size_t		len = n - start < slice_items ? n - start : slice_items;

		radix_sort(items + start, len, 1, scratch);
	}
}

/*
 * Size classes.  STR groups boxes by their centres only; with real data a
 * few long boxes (the trip-joining boxes of taxi trajectories, roads crossing
 * a map) then land in most leaves and give nearly every leaf a huge box, so
 * every query visits most leaves.  We first split the boxes by extent into
 * classes a factor of four apart, counted from the median extent, and pack
 * each class with STR on its own: long boxes share a few leaves whose big
 * boxes overlap each other, not everybody's.
 */
double
amr_pack_extent(const AmrFBox *b)
{
	double		w = amr_clamp(b->xhi) - amr_clamp(b->xlo);
	double		h = amr_clamp(b->yhi) - amr_clamp(b->ylo);

	return w > h ? w : h;
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a;
	double		y = *(const double *) b;

	return (x > y) - (x < y);
}

/* class 0 holds everything up to four times the (sampled) median extent */
double
amr_pack_class_base(double *extents, size_t n)
{
	if (n == 0)
		return 0.0;
	qsort(extents, n, sizeof(double), cmp_double);
	return extents[n / 2] * 4.0;
}

int
amr_pack_size_class(const AmrFBox *b, double base)
{
	double		e = amr_pack_extent(b);
	double		limit = base;
	int			k = 0;

	while (k < AMR_SIZE_CLASSES - 1 && e > limit)
	{
		k++;
		limit *= 4.0;
	}
	return k;
}

size_t
amr_pack_order(AmrPackItem *items, size_t n, size_t per_group,
			   AmrPackItem *scratch, size_t *bounds)
{
	double		sample[1024];
	size_t		nsample = 0;
	size_t		step = n / 1024 + 1;
	double		base;
	size_t		counts[AMR_SIZE_CLASSES] = {0};
	size_t		start[AMR_SIZE_CLASSES];
	size_t		sum = 0;
	size_t		nclasses = 0;
	size_t		i;
	int			c;

	bounds[0] = 0;
	if (n == 0)
		return 0;

	for (i = 0; i < n && nsample < 1024; i += step)
		sample[nsample++] = amr_pack_extent(&items[i].box);
	base = amr_pack_class_base(sample, nsample);

	/* stable counting sort by class, through scratch */
	for (i = 0; i < n; i++)
		counts[amr_pack_size_class(&items[i].box, base)]++;
	for (c = 0; c < AMR_SIZE_CLASSES; c++)
	{
		start[c] = sum;
		sum += counts[c];
	}
	for (i = 0; i < n; i++)
		scratch[start[amr_pack_size_class(&items[i].box, base)]++] = items[i];
	memcpy(items, scratch, n * sizeof(AmrPackItem));

	/* STR within each class; report the non-empty classes' bounds */
	sum = 0;
	for (c = 0; c < AMR_SIZE_CLASSES; c++)
	{
		if (counts[c] == 0)
			continue;
		bounds[nclasses++] = sum;
		amr_str_order(items + sum, counts[c], per_group, scratch);
		sum += counts[c];
	}
	bounds[nclasses] = sum;
	return nclasses;
}

/* ---- point items: the leaf level of a build ---- */

static inline uint32_t
point_key(const AmrPackPoint *p, int axis)
{
	return axis == 0 ? p->xkey : p->ykey;
}

/* radix_sort for point items: 32-bit keys, three passes at most */
void
amr_pack_points_sort(AmrPackPoint *items, size_t n, int axis, AmrPackPoint *scratch)
{
	enum
	{
		BITS = 11, BUCKETS = 1 << BITS, PASSES = (32 + BITS - 1) / BITS
	};
	static __thread size_t tls_counts[PASSES][BUCKETS];
	size_t		(*counts)[BUCKETS] = tls_counts;
	AmrPackPoint *src = items;
	AmrPackPoint *dst = scratch;
	size_t		i;
	int			pass;

	if (n < 256)
	{
		for (i = 1; i < n; i++)
		{
			AmrPackPoint tmp = items[i];
			uint32_t	k = point_key(&tmp, axis);
			size_t		j = i;

			while (j > 0 && point_key(&items[j - 1], axis) > k)
			{
				items[j] = items[j - 1];
				j--;
			}
			items[j] = tmp;
		}
		return;
	}
	memset(counts, 0, sizeof(tls_counts));
	for (i = 0; i < n; i++)
	{
		uint32_t	key = point_key(&src[i], axis);

		for (pass = 0; pass < PASSES; pass++)
			counts[pass][(key >> (pass * BITS)) & (BUCKETS - 1)]++;
	}
	for (pass = 0; pass < PASSES; pass++)
	{
		int			shift = pass * BITS;
		size_t	   *cnt = counts[pass];
		size_t		sum = 0;
		bool		constant = false;

		for (i = 0; i < BUCKETS; i++)
		{
			size_t		c = cnt[i];

			if (c == n)
				constant = true;
			cnt[i] = sum;
			sum += c;
		}
		if (constant)
			continue;
		for (i = 0; i < n; i++)
		{
			uint32_t	digit = (point_key(&src[i], axis) >> shift) & (BUCKETS - 1);

			dst[cnt[digit]++] = src[i];
		}
		{
			AmrPackPoint *t = src;

			src = dst;
			dst = t;
		}
	}
	if (src != items)
		memcpy(items, src, n * sizeof(AmrPackPoint));
}

void
amr_pack_points_by_class(AmrPackPoint *items, const uint8_t *cls, size_t n,
						 AmrPackPoint *scratch, size_t *counts)
{
	size_t		start[AMR_SIZE_CLASSES];
	size_t		sum = 0;
	size_t		i;
	int			c;

	memset(counts, 0, AMR_SIZE_CLASSES * sizeof(size_t));
	for (i = 0; i < n; i++)
		counts[cls[i]]++;
	for (c = 0; c < AMR_SIZE_CLASSES; c++)
	{
		start[c] = sum;
		sum += counts[c];
	}
	for (i = 0; i < n; i++)
		scratch[start[cls[i]]++] = items[i];
	memcpy(items, scratch, n * sizeof(AmrPackPoint));
}

size_t
amr_pack_points_order(AmrPackPoint *items, const uint8_t *cls, size_t n,
					  size_t per_group, AmrPackPoint *scratch, size_t *bounds)
{
	size_t		counts[AMR_SIZE_CLASSES];
	size_t		sum = 0;
	size_t		nclasses = 0;
	int			c;

	bounds[0] = 0;
	if (n == 0)
		return 0;
	amr_pack_points_by_class(items, cls, n, scratch, counts);

	/* STR within each class, as amr_str_order does for box items */
	for (c = 0; c < AMR_SIZE_CLASSES; c++)
	{
		size_t		len = counts[c];
		AmrPackPoint *part = items + sum;

		if (len == 0)
			continue;
		bounds[nclasses++] = sum;
		if (len > per_group && per_group > 0)
		{
			size_t		slice_items = amr_str_slice_items(len, per_group);
			size_t		first;

			amr_pack_points_sort(part, len, 0, scratch);
			for (first = 0; first < len; first += slice_items)
				amr_pack_points_sort(part + first, len - first < slice_items ? len - first : slice_items,
									 1, scratch);
		}
		sum += len;
	}
	bounds[nclasses] = sum;
	return nclasses;
}

size_t
amr_build_levels_nodes_needed(size_t n, int fill)
{
	size_t		total = 0;

	/* an upper bound: each size class may end in a partly filled node */
	do
	{
		size_t		groups = n <= (size_t) fill ? 1 : (n + fill - 1) / fill + AMR_SIZE_CLASSES;

		total += groups;
		n = groups;
	} while (n > 1);
	return total;
}

AmrStatus
amr_build_levels(AmrStore *s, AmrTree *t, bool nulls, AmrPackItem *items,
				 size_t n, int fill, AmrPackItem *scratch, uint32_t *node_ids)
{
	size_t		needed = amr_build_levels_nodes_needed(n, fill);
	size_t		used = 0;
	size_t		i;
	int			level = 1;
	AmrStatus	result = AMR_OK;

	/* reserve every node first so that failure changes nothing */
	for (i = 0; i < needed; i++)
	{
		if (amr_node_alloc(s, &node_ids[i], 1) != AMR_OK)
		{
			while (i > 0)
				amr_node_free(s, node_ids[--i]);
			return AMR_ERR_DRAM_FULL;
		}
	}

	for (;;)
	{
		size_t		bounds[AMR_SIZE_CLASSES + 1];
		size_t		nclasses;
		size_t		groups = 0;
		size_t		c;

		if (level > AMR_MAX_HEIGHT)
		{
			result = AMR_ERR_TOO_TALL;
			break;
		}
		if (n <= (size_t) fill)
		{
			/* the root: everything that is left, possibly nothing */
			AmrInnerNode *root = &s->nodes[node_ids[used]];

			root->level = (uint16_t) level;
			root->count = 0;
			for (i = 0; i < n; i++)
			{
				amr_node_set_entry(root, root->count, &items[i].box, items[i].ref);
				root->count++;
			}
			if (nulls)
			{
				t->null_root = node_ids[used];
				t->null_height = (uint32_t) level;
			}
			else
			{
				t->root = node_ids[used];
				t->height = (uint32_t) level;
			}
			used++;
			break;
		}

		nclasses = amr_pack_order(items, n, (size_t) fill, scratch, bounds);
		for (c = 0; c < nclasses; c++)
		{
			size_t		pos = bounds[c];

			while (pos < bounds[c + 1])
			{
				size_t		take = bounds[c + 1] - pos < (size_t) fill ?
				bounds[c + 1] - pos : (size_t) fill;
				uint32_t	node_id = node_ids[used++];
				AmrInnerNode *node = &s->nodes[node_id];

				node->level = (uint16_t) level;
				node->count = 0;
				for (i = 0; i < take; i++)
				{
					amr_node_set_entry(node, node->count, &items[pos + i].box,
									   items[pos + i].ref);
					node->count++;
				}
				pos += take;
				/* the node becomes an item of the next level (groups < pos) */
				items[groups].box = amr_node_union(node);
				items[groups].ref = node_id;
				groups++;
			}
		}
		n = groups;
		level++;
	}

	if (result != AMR_OK)
	{
		for (i = 0; i < needed; i++)
			amr_node_free(s, node_ids[i]);
		return result;
	}
	for (i = used; i < needed; i++)
		amr_node_free(s, node_ids[i]);
	amr_counter_add(&t->ninner, used);
	return AMR_OK;
}

/* ---- R*-tree split ---- */

typedef struct SortRef
{
	uint64_t	key;			/* (k1, k2) packed so that integer order is
								 * their lexicographic order */
	int			idx;
} SortRef;

static inline uint32_t
float_order_bits(float f)
{
	uint32_t	u;

	memcpy(&u, &f, sizeof(u));
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline uint64_t
pair_key(float k1, float k2)
{
	return ((uint64_t) float_order_bits(k1) << 32) | float_order_bits(k2);
}

/* bottom-up merge sort: O(n log n) for the ~85 entries of a split */
static void
sort_refs(SortRef *r, int n, SortRef *tmp)
{
	int			width;
	SortRef    *src = r,
			   *dst = tmp;

	for (width = 1; width < n; width *= 2)
	{
		int			lo;

		for (lo = 0; lo < n; lo += 2 * width)
		{
			int			mid = lo + width < n ? lo + width : n;
			int			hi = lo + 2 * width < n ? lo + 2 * width : n;
			int			a = lo,
						b = mid,
						k = lo;

			while (a < mid && b < hi)
			{
				/* branch-free: the comparison is unpredictable */
				int			take_b = src[b].key < src[a].key;

				dst[k++] = src[take_b ? b : a];
				b += take_b;
				a += !take_b;
			}
			while (a < mid)
				dst[k++] = src[a++];
			while (b < hi)
				dst[k++] = src[b++];
		}
		{
			SortRef    *t = src;

			src = dst;
			dst = t;
		}
	}
	if (src != r)
		memcpy(r, src, sizeof(SortRef) * n);
}

/*
 * R*-tree split (Beckmann et al.), with one sort per axis (by lower bound,
 * upper bound breaking ties) instead of two: choose the axis whose
 * distributions have the smallest total margin, then on it the distribution
 * with the least overlap, then the least total area.
 */
void
amr_rstar_split(const AmrFBox *boxes, int n, int min_fill, uint8_t *goes_right)
{
	SortRef		order[2][AMR_LEAF_CAPACITY + AMR_INNER_FANOUT + 2];
	SortRef		tmp[AMR_LEAF_CAPACITY + AMR_INNER_FANOUT + 2];
	AmrFBox		pre[2][AMR_LEAF_CAPACITY + AMR_INNER_FANOUT + 2];
	AmrFBox		suf[2][AMR_LEAF_CAPACITY + AMR_INNER_FANOUT + 2];
	double		margin[2] = {0, 0};
	int			axis,
				i,
				k;
	int			best_k = 0;
	double		best_overlap = 0,
				best_area = 0;
	bool		have_best = false;

	if (min_fill < 1)
		min_fill = 1;
	if (2 * min_fill > n)
		min_fill = n / 2;

	for (i = 0; i < n; i++)
	{
		order[0][i] = (SortRef)
		{
			pair_key(boxes[i].xlo, boxes[i].xhi), i
		};
		order[1][i] = (SortRef)
		{
			pair_key(boxes[i].ylo, boxes[i].yhi), i
		};
	}
	for (axis = 0; axis < 2; axis++)
	{
		AmrFBox    *p = pre[axis];
		AmrFBox    *q = suf[axis];
		SortRef    *o = order[axis];

		sort_refs(o, n, tmp);
		p[0] = boxes[o[0].idx];
		for (i = 1; i < n; i++)
		{
			p[i] = p[i - 1];
			amr_fbox_extend(&p[i], &boxes[o[i].idx]);
		}
		q[n - 1] = boxes[o[n - 1].idx];
		for (i = n - 2; i >= 0; i--)
		{
			q[i] = q[i + 1];
			amr_fbox_extend(&q[i], &boxes[o[i].idx]);
		}
		for (k = min_fill; k <= n - min_fill; k++)
			margin[axis] += amr_fbox_margin(&p[k - 1]) + amr_fbox_margin(&q[k]);
	}
	axis = margin[1] < margin[0] ? 1 : 0;

	for (k = min_fill; k <= n - min_fill; k++)
	{
		double		ov = amr_fbox_overlap_area(&pre[axis][k - 1], &suf[axis][k]);
		double		ar = amr_fbox_area(&pre[axis][k - 1]) + amr_fbox_area(&suf[axis][k]);

		if (!have_best || ov < best_overlap ||
			(ov == best_overlap && ar < best_area))
		{
			have_best = true;
			best_overlap = ov;
			best_area = ar;
			best_k = k;
		}
	}

	for (i = 0; i < n; i++)
		goes_right[order[axis][i].idx] = (i >= best_k) ? 1 : 0;
}
