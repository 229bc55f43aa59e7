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
 * (6 passes); scratch holds n items.  Passes whose digit is constant are
 * skipped, which is common for clustered data.
 */
static void
radix_sort(AmrPackItem *items, size_t n, int axis, AmrPackItem *scratch)
{
	enum
	{
		BITS = 11, BUCKETS = 1 << BITS, PASSES = (64 + BITS - 1) / BITS
	};
	static __thread size_t counts[BUCKETS];
	AmrPackItem *src = items;
	AmrPackItem *dst = scratch;
	int			pass;

	if (n < 256)
	{
		insertion_sort(items, n, axis);
		return;
	}
	for (pass = 0; pass < PASSES; pass++)
	{
		int			shift = pass * BITS;
		size_t		i;
		size_t		sum = 0;
		uint64_t	first_digit;
		bool		constant = true;

		memset(counts, 0, sizeof(counts));
		first_digit = (item_key(&src[0], axis) >> shift) & (BUCKETS - 1);
		for (i = 0; i < n; i++)
		{
			uint64_t	digit = (item_key(&src[i], axis) >> shift) & (BUCKETS - 1);

			counts[digit]++;
			if (digit != first_digit)
				constant = false;
		}
		if (constant)
			continue;
		for (i = 0; i < BUCKETS; i++)
		{
			size_t		c = counts[i];

			counts[i] = sum;
			sum += c;
		}
		for (i = 0; i < n; i++)
		{
			uint64_t	digit = (item_key(&src[i], axis) >> shift) & (BUCKETS - 1);

			dst[counts[digit]++] = src[i];
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

void
amr_str_order(AmrPackItem *items, size_t n, size_t per_group,
			  AmrPackItem *scratch)
{
	size_t		groups,
				slices,
				slice_items,
				start;

	if (n <= per_group || per_group == 0)
		return;
	groups = (n + per_group - 1) / per_group;
	slices = (size_t) ceil(sqrt((double) groups));
	slice_items = slices * per_group;

	radix_sort(items, n, 0, scratch);
	for (start = 0; start < n; start += slice_items)
	{
		size_t		len = n - start < slice_items ? n - start : slice_items;

		radix_sort(items + start, len, 1, scratch);
	}
}

size_t
amr_build_levels_nodes_needed(size_t n, int fill)
{
	size_t		total = 0;

	do
	{
		size_t		groups = n == 0 ? 1 : (n + fill - 1) / fill;

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

	if (n == 0)
	{
		/* an empty tree is a single empty level-1 node */
		s->nodes[node_ids[0]].count = 0;
		s->nodes[node_ids[0]].level = 1;
		if (nulls)
		{
			t->null_root = node_ids[0];
			t->null_height = 1;
		}
		else
		{
			t->root = node_ids[0];
			t->height = 1;
		}
		__atomic_add_fetch(&t->ninner, 1, __ATOMIC_RELAXED);
		return AMR_OK;
	}

	for (;;)
	{
		size_t		groups = (n + fill - 1) / fill;
		size_t		g,
					pos = 0;

		if (level > AMR_MAX_HEIGHT)
		{
			for (i = 0; i < needed; i++)
				amr_node_free(s, node_ids[i]);
			return AMR_ERR_TOO_TALL;
		}
		amr_str_order(items, n, (size_t) fill, scratch);
		for (g = 0; g < groups; g++)
		{
			/* spread items evenly: sizes differ by at most one */
			size_t		take = n / groups + (g < n % groups ? 1 : 0);
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
			/* the node becomes an item of the next level (in place: g <= pos) */
			items[g].box = amr_node_union(node);
			items[g].ref = node_id;
		}
		if (groups == 1)
		{
			if (nulls)
			{
				t->null_root = items[0].ref;
				t->null_height = (uint32_t) level;
			}
			else
			{
				t->root = items[0].ref;
				t->height = (uint32_t) level;
			}
			break;
		}
		n = groups;
		level++;
	}
	__atomic_add_fetch(&t->ninner, used, __ATOMIC_RELAXED);
	return AMR_OK;
}

/* ---- R*-tree split ---- */

typedef struct SortRef
{
	float		k1;
	float		k2;
	int			idx;
} SortRef;

static void
sort_refs(SortRef *r, int n)
{
	int			i;

	for (i = 1; i < n; i++)
	{
		SortRef		tmp = r[i];
		int			j = i;

		while (j > 0 && (r[j - 1].k1 > tmp.k1 ||
						 (r[j - 1].k1 == tmp.k1 && r[j - 1].k2 > tmp.k2)))
		{
			r[j] = r[j - 1];
			j--;
		}
		r[j] = tmp;
	}
}

void
amr_rstar_split(const AmrFBox *boxes, int n, int min_fill, uint8_t *goes_right)
{
	SortRef		order[4][AMR_LEAF_CAPACITY + AMR_INNER_FANOUT + 2];
	AmrFBox		pre[AMR_LEAF_CAPACITY + AMR_INNER_FANOUT + 2];
	AmrFBox		suf[AMR_LEAF_CAPACITY + AMR_INNER_FANOUT + 2];
	double		margin[2] = {0, 0};
	int			s,
				i,
				k,
				axis;
	int			best_sort = 0,
				best_k = 0;
	double		best_overlap = 0,
				best_area = 0;
	bool		have_best = false;

	if (min_fill < 1)
		min_fill = 1;
	if (2 * min_fill > n)
		min_fill = n / 2;

	for (i = 0; i < n; i++)
	{
		order[0][i] = (SortRef) {boxes[i].xlo, boxes[i].xhi, i};
		order[1][i] = (SortRef) {boxes[i].xhi, boxes[i].xlo, i};
		order[2][i] = (SortRef) {boxes[i].ylo, boxes[i].yhi, i};
		order[3][i] = (SortRef) {boxes[i].yhi, boxes[i].ylo, i};
	}
	for (s = 0; s < 4; s++)
	{
		sort_refs(order[s], n);
		pre[0] = boxes[order[s][0].idx];
		for (i = 1; i < n; i++)
		{
			pre[i] = pre[i - 1];
			amr_fbox_extend(&pre[i], &boxes[order[s][i].idx]);
		}
		suf[n - 1] = boxes[order[s][n - 1].idx];
		for (i = n - 2; i >= 0; i--)
		{
			suf[i] = suf[i + 1];
			amr_fbox_extend(&suf[i], &boxes[order[s][i].idx]);
		}
		for (k = min_fill; k <= n - min_fill; k++)
			margin[s / 2] += amr_fbox_margin(&pre[k - 1]) + amr_fbox_margin(&suf[k]);
	}
	axis = margin[1] < margin[0] ? 1 : 0;

	for (s = axis * 2; s < axis * 2 + 2; s++)
	{
		pre[0] = boxes[order[s][0].idx];
		for (i = 1; i < n; i++)
		{
			pre[i] = pre[i - 1];
			amr_fbox_extend(&pre[i], &boxes[order[s][i].idx]);
		}
		suf[n - 1] = boxes[order[s][n - 1].idx];
		for (i = n - 2; i >= 0; i--)
		{
			suf[i] = suf[i + 1];
			amr_fbox_extend(&suf[i], &boxes[order[s][i].idx]);
		}
		for (k = min_fill; k <= n - min_fill; k++)
		{
			double		ov = amr_fbox_overlap_area(&pre[k - 1], &suf[k]);
			double		ar = amr_fbox_area(&pre[k - 1]) + amr_fbox_area(&suf[k]);

			if (!have_best || ov < best_overlap ||
				(ov == best_overlap && ar < best_area))
			{
				have_best = true;
				best_overlap = ov;
				best_area = ar;
				best_sort = s;
				best_k = k;
			}
		}
	}

	for (i = 0; i < n; i++)
		goes_right[order[best_sort][i].idx] = (i >= best_k) ? 1 : 0;
}
