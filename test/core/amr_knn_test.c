/*
 * amr_knn_test.c
 *		Unit tests of the KNN core (amr_knn.c, the distances in amr_geom.h),
 *		run without a server.
 *
 * The distances are checked against values PostgreSQL 15.20 computed for
 * the same arguments, the float4 lower bound against the exact distance on
 * adversarial cases, and the best-first search against brute force on trees
 * built by inserts (with splits) and by bulk packing, driven the way the AM
 * glue is meant to drive it (see amr_knn.h), including splits between its
 * steps.  Prints "ok <name>" / "FAIL <name>" per test and a closing line,
 * like amr_core_test.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amr_knn.h"
#include "amr_persist.h"
#include "amr_tree.h"

#define T_SLOTS 16384
#define T_NODES 4096
#define RNG_SEED 4242
#include "amr_test_support.h"

/* ---- data ---- */


static AmrBox
box_of(double xlo, double ylo, double xhi, double yhi)
{
	AmrBox		b = {xlo, ylo, xhi, yhi};

	return b;
}

/*
 * Mostly small boxes and points in the unit square, with exact duplicates
 * of boxes and of points, boxes thinner than EPSILON, huge boxes and boxes
 * infinite in one or more directions.
 */
static AmrBox
random_row_box(void)
{
	uint64_t	r = rng_next() % 1000;
	double		x = rnd(),
				y = rnd();

	if (r < 300)
		return box_of(x, y, x, y);	/* zero-area */
	if (r < 330)
	{
		static const AmrBox dups[] = {
			{0.25, 0.25, 0.2500004, 0.26}, {0.5, 0.5, 0.6, 0.6}, {0.7, 0.1, 0.7, 0.1}
		};

		return dups[rng_next() % 3];
	}
	if (r < 350)
	{
		double		w = (double) (rng_next() % 3) * 5e-7;

		return box_of(x, y, x + w, y + rnd() * 0.01);
	}
	if (r < 356)
		return box_of(-1e300, y - 1e200, x * 1e300, 1e250);
	if (r < 362)
	{
		switch (rng_next() % 4)
		{
			case 0:
				return box_of(-INFINITY, y, x, INFINITY);
			case 1:
				return box_of(x, y, x + 0.01, INFINITY);
			case 2:
				return box_of(-INFINITY, -INFINITY, INFINITY, INFINITY);
			default:
				return box_of(x, -INFINITY, INFINITY, y);
		}
	}
	return box_of(x, y, x + rnd() * 0.02, y + rnd() * 0.02);
}

static Row *
make_rows(size_t n, uint32_t first_id)
{
	Row		   *rows = malloc(sizeof(Row) * n);
	size_t		i;

	for (i = 0; i < n; i++)
	{
		rows[i].id = first_id + (uint32_t) i;
		rows[i].isnull = rng_next() % 100 == 0;
		rows[i].b = random_row_box();
	}
	return rows;
}

static AmrPoint
random_query(void)
{
	AmrPoint	q;

	q.x = rnd() * 1.2 - 0.1;
	q.y = rnd() * 1.2 - 0.1;
	switch (rng_next() % 12)
	{
		case 0:					/* a duplicate's corner, or just beside it */
			q.x = 0.25 + (double) (rng_next() % 3) * 4e-7;
			q.y = 0.26;
			break;
		case 1:					/* far away */
			q.x = 100.0;
			q.y = -50.0;
			break;
		case 2:
			q.x = (rng_next() & 1) ? INFINITY : -INFINITY;
			break;
		case 3:
			q.x = 0.7;
			q.y = 0.1;
			break;
		default:
			break;
	}
	return q;
}

/* ---- brute force ---- */

typedef struct Ranked
{
	double		distance;
	uint32_t	id;
} Ranked;

/* Distance as PostgreSQL orders float8, then id (to compare ties as sets). */
static int
cmp_ranked(const void *a, const void *b)
{
	const Ranked *x = a;
	const Ranked *y = b;

	if (amr_float8_lt(x->distance, y->distance))
		return -1;
	if (amr_float8_lt(y->distance, x->distance))
		return 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

typedef enum DistKind
{
	DIST_BOX_POINT,				/* box <-> point */
	DIST_POINT_POINT			/* point <-> point, keys as degenerate boxes */
} DistKind;

static double
key_distance(DistKind kind, const AmrBox *key, const AmrPoint *q)
{
	if (kind == DIST_POINT_POINT)
	{
		AmrPoint	p = {key->xlo, key->ylo};

		return amr_dist_point_point(&p, q);
	}
	return amr_dist_box_point(key, q);
}

/* Rows with id < visible_limit that are not NULL, sorted; returns count. */
static size_t
brute_force(const Row *rows, size_t nrows, uint32_t visible_limit, DistKind kind,
			const AmrPoint *q, Ranked *out)
{
	size_t		n = 0;
	size_t		i;

	for (i = 0; i < nrows; i++)
	{
		if (rows[i].isnull || rows[i].id >= visible_limit)
			continue;
		out[n].distance = key_distance(kind, &rows[i].b, q);
		out[n].id = rows[i].id;
		n++;
	}
	qsort(out, n, sizeof(Ranked), cmp_ranked);
	return n;
}

/* ---- driving a search the way the AM glue will ---- */

/*
 * When set, run_knn feeds box entries under the float4 box's lower bound
 * (amr_knn_add_entry_bound) and computes their distances only at
 * AMR_KNN_REFINE, as amr_scan.c does for box_ops; the expected results are
 * the same.  fed_distance[row] keeps the distance a REFINE step feeds.
 */
static bool lazy_feed = false;
static double fed_distance[1 << 16];
static uint64_t refines;

typedef void (*StepHook) (AmrTree *t, int step_no);

typedef struct KnnRun
{
	size_t		n;				/* entries returned */
	uint64_t	leaves;			/* leaves read */
	uint64_t	right_links;	/* right links followed */
} KnnRun;

/*
 * Take up to k entries.  Entries of rows at or beyond visible_limit stand
 * for rows inserted after the scan started (invisible to its snapshot) and
 * are not fed.  Checks on the way: that distances never decrease, that every
 * entry of a leaf lies at or beyond the leaf's bound, that no leaf is read
 * twice in one pass, and that the recheck flag travels with its entry.
 */
static bool
run_knn(AmrKnnSearch *s, AmrTree *t, const AmrPoint *q, size_t k, DistKind kind,
		uint32_t visible_limit, StepHook hook, Ranked *out, size_t out_cap,
		KnnRun *run)
{
	static uint8_t read_in_pass[T_SLOTS];
	uint64_t	pass_restarts = 0;
	int			step_no = 0;

	memset(run, 0, sizeof(*run));
	memset(read_in_pass, 0, sizeof(read_in_pass));
	amr_knn_begin(s, &st, t, q);
	while (run->n < k)
	{
		AmrKnnResult r;
		AmrKnnStep	step = amr_knn_next(s, &r);

		if (s->restarts != pass_restarts)
		{
			pass_restarts = s->restarts;
			memset(read_in_pass, 0, sizeof(read_in_pass));
		}
		if (step == AMR_KNN_DONE)
			break;
		if (step == AMR_KNN_REFINE)
		{
			CHECK(lazy_feed, "REFINE for an entry fed with its distance");
			CHECK(r.payload < sizeof(fed_distance) / sizeof(fed_distance[0]), "payload %llu",
				  (unsigned long long) r.payload);
			CHECK(!amr_float8_lt(fed_distance[r.payload], r.distance),
				  "row %llu: distance %.17g below its bound %.17g",
				  (unsigned long long) r.payload, fed_distance[r.payload], r.distance);
			refines++;
			amr_knn_add_entry(s, fed_distance[r.payload], r.seq, r.payload, r.seq % 7 == 3);
			continue;
		}
		if (hook)
			hook(t, step_no++);
		if (step == AMR_KNN_ENTRY)
		{
			if (run->n > 0)
			{
				const Ranked *prev = &out[run->n - 1];

				CHECK(!amr_float8_lt(r.distance, prev->distance),
					  "entry %llu (%.17g) came after %u (%.17g)",
					  (unsigned long long) r.seq, r.distance, prev->id, prev->distance);
			}
			CHECK(run->n < out_cap, "more entries returned than there are rows");
			CHECK(r.payload == r.seq, "payload %llu returned with seq %llu",
				  (unsigned long long) r.payload, (unsigned long long) r.seq);
			CHECK(r.recheck == (r.seq % 7 == 3), "recheck flag lost for %llu",
				  (unsigned long long) r.seq);
			out[run->n].distance = r.distance;
			out[run->n].id = (uint32_t) r.seq;
			run->n++;
		}
		else
		{
			uint64_t	w = amr_lt_word(&st, r.leaf_id);
			const AmrLeaf *leaf = amr_pmem_slot(&st, AMR_WORD_SLOT(w));
			const AmrLeafVolatile *v = &st.leaves[r.leaf_id];
			uint64_t	j;

			CHECK(r.leaf_id < T_SLOTS && AMR_WORD_TIER(w) == AMR_TIER_PMEM,
				  "leaf %u is not in use", r.leaf_id);
			CHECK(!read_in_pass[r.leaf_id], "leaf %u handed out twice", r.leaf_id);
			read_in_pass[r.leaf_id] = 1;
			CHECK(!isnan(r.distance) && r.distance >= 0.0, "leaf bound %g", r.distance);
			run->leaves++;
			for (j = 0; j < leaf->hdr.nentries; j++)
			{
				const AmrLeafEntry *e = &leaf->entries[j];
				uint32_t	row = entry_row(e);
				double		d;

				if (e->flags & (AMR_ENTRY_FLAG_NULL | AMR_ENTRY_FLAG_DEAD))
					continue;
				if (row >= visible_limit)
					continue;
				d = key_distance(kind, &e->key, q);
				CHECK(!amr_float8_lt(d, r.distance),
					  "leaf %u bound %.17g above entry %u at %.17g (query %g,%g)",
					  r.leaf_id, r.distance, row, d, q->x, q->y);
				if (lazy_feed && row < sizeof(fed_distance) / sizeof(fed_distance[0]))
				{
					AmrFBox		fb = amr_fbox_from_box(&e->key);

					fed_distance[row] = d;
					amr_knn_add_entry_bound(s, amr_fbox_point_lower_bound(&fb, q), row, row);
				}
				else
					amr_knn_add_entry(s, d, row, row, row % 7 == 3);
			}
			/* entries moved by a split since the leaf's id was read */
			if (v->nsn > r.split_stamp && v->rightlink != AMR_INVALID_LEAF)
			{
				amr_knn_add_leaf(s, v->rightlink, r.distance, r.split_stamp);
				run->right_links++;
			}
		}
	}
	CHECK(s->entries_late == 0, "%llu entries fed below the last one returned",
		  (unsigned long long) s->entries_late);
	return true;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t	x = *(const uint32_t *) a;
	uint32_t	y = *(const uint32_t *) b;

	return x < y ? -1 : x > y;
}

/*
 * The first k of the search against the first k of brute force: the same
 * distances, exactly, and at each distance the same rows -- all of them,
 * except at the last distance when k cut that group short, where the rows
 * returned must be some of those at that distance.  (Ties across leaves
 * are not ordered by id, see amr_knn.h.)
 */
static bool
same_ranking(const Ranked *got, size_t ngot, const Ranked *expect, size_t nexpect,
			 size_t k, const AmrPoint *q)
{
	size_t		want = k < nexpect ? k : nexpect;
	uint32_t   *ids = malloc(sizeof(uint32_t) * (want + 1));
	size_t		start,
				i;

	CHECK(ngot == want, "query (%g,%g) k=%zu: %zu entries, expected %zu",
		  q->x, q->y, k, ngot, want);
	for (i = 0; i < want; i++)
		CHECK(amr_float8_eq(got[i].distance, expect[i].distance) &&
			  signbit(got[i].distance) == signbit(expect[i].distance),
			  "query (%g,%g) k=%zu rank %zu: distance %.17g, expected %.17g",
			  q->x, q->y, k, i, got[i].distance, expect[i].distance);
	for (start = 0; start < want;)
	{
		size_t		end = start + 1,
					expect_end,
					j;

		while (end < want && amr_float8_eq(got[end].distance, got[start].distance))
			end++;
		expect_end = end;
		while (expect_end < nexpect &&
			   amr_float8_eq(expect[expect_end].distance, got[start].distance))
			expect_end++;
		CHECK(end == want || expect_end == end,
			  "query (%g,%g) k=%zu: %zu rows at %.17g, expected %zu",
			  q->x, q->y, k, end - start, got[start].distance, expect_end - start);
		for (i = start; i < end; i++)
			ids[i - start] = got[i].id;
		qsort(ids, end - start, sizeof(uint32_t), cmp_u32);
		/* expect is sorted by id within a distance: merge */
		for (i = 0, j = start; i < end - start; i++, j++)
		{
			CHECK(i == 0 || ids[i] != ids[i - 1],
				  "query (%g,%g) k=%zu: row %u returned twice", q->x, q->y, k, ids[i]);
			while (j < expect_end && expect[j].id < ids[i])
				j++;
			CHECK(j < expect_end && expect[j].id == ids[i],
				  "query (%g,%g) k=%zu: row %u at %.17g is not a row at that distance",
				  q->x, q->y, k, ids[i], got[start].distance);
		}
		start = end;
	}
	free(ids);
	return true;
}

/* Compare k = 1, 10 and all for nqueries queries. */
static bool
compare_with_brute_force(AmrTree *t, const Row *rows, size_t nrows, DistKind kind,
						 int nqueries, bool check_effort)
{
	Ranked	   *expect = malloc(sizeof(Ranked) * nrows);
	Ranked	   *got = malloc(sizeof(Ranked) * nrows);
	AmrKnnSearch s;
	uint64_t	k1_leaves = 0;
	int			k1_runs = 0;
	int			qn;
	bool		ok = true;

	amr_knn_init(&s, test_realloc, NULL);
	for (qn = 0; qn < nqueries && ok; qn++)
	{
		AmrPoint	q = random_query();
		size_t		nexpect;
		size_t		ks[3] = {1, 10, SIZE_MAX};
		int			ki;

		if (qn == 0)
			q.x = NAN;			/* NaN distances come last, ordered by id */
		nexpect = brute_force(rows, nrows, UINT32_MAX, kind, &q, expect);
		for (ki = 0; ki < 3 && ok; ki++)
		{
			KnnRun		run;

			ok = run_knn(&s, t, &q, ks[ki], kind, UINT32_MAX, NULL, got, nrows, &run) &&
				same_ranking(got, run.n, expect, nexpect, ks[ki], &q);
			if (ok && ks[ki] == 1 && isfinite(q.x) && isfinite(q.y) &&
				q.x >= 0 && q.x <= 1 && q.y >= 0 && q.y <= 1)
			{
				k1_leaves += run.leaves;
				k1_runs++;
			}
		}
	}
	free(s.heap);
	free(s.returned);
	free(expect);
	free(got);
	if (ok && check_effort && k1_runs > 0)
	{
		double		avg = (double) k1_leaves / k1_runs;

		printf("# k=1 inside the unit square: %.1f of %llu leaves read on average\n",
			   avg, (unsigned long long) t->nleaves);
		CHECK(avg < (double) t->nleaves / 8,
			  "k=1 reads %.1f of %llu leaves on average", avg,
			  (unsigned long long) t->nleaves);
	}
	return ok;
}

static AmrTree *
insert_rows(const Row *rows, size_t n, uint32_t tree_no)
{
	AmrTree    *t = new_tree(tree_no);
	size_t		i;

	for (i = 0; i < n; i++)
	{
		AmrLeafEntry e = make_entry(&rows[i]);

		if (amr_insert_single(&st, t, &e) != AMR_OK)
			abort();
	}
	return t;
}

/* ---- tests ---- */

/* box <-> point: values PostgreSQL 15.20 returned for the same arguments */
static bool
test_box_point_golden(void)
{
	static const struct
	{
		AmrBox		b;
		AmrPoint	q;
		double		expect;
	}			cases[] = {
		{{0, 0, 1, 1}, {0.5, 0.5}, 0},
		{{0, 0, 1, 1}, {1, 0.25}, 0},	/* on the border */
		{{0, 0, 1, 1}, {-0.5, 0.5}, 0.5},
		{{0, 0, 1, 1}, {-0.5, -0.25}, 0.5590169943749475},
		{{0, 0, 1, 1}, {2, 3}, 2.23606797749979},
		/* within EPSILON beyond a corner: the corner, not the edge's line */
		{{0, 0, 1, 1}, {-0.5, 1.0000004}, 0.50000000000016},
		{{0, 0, 1, 1}, {-0.5, 0.9999996}, 0.50000000000016},
		{{0, 0, 1, 1}, {1.0000004, 1.0000004}, 5.656854249655047e-07},
		{{0, 0, 1, 1}, {-3e-7, 2}, 1.0000000000000449},
		{{0, 0, 1, 1}, {-3e-6, 2}, 1.0000000000045},
		/* narrower than EPSILON: horizontal edges count as vertical */
		{{0, 0, 5e-7, 1}, {2, 0.5}, 1.9999995},
		{{0, 0, 5e-7, 1}, {0.25, 3}, 2.0155643750573313},
		{{0, 0, 5e-7, 1}, {2.5e-7, 1.0000002}, 3.2015621180588006e-07},
		{{0.5, 0.5, 0.5, 0.5}, {1.5, 0.5}, 1},
		{{0.5, 0.5, 0.5, 0.5}, {0.5000001, 0.5000003}, 3.1622776595571454e-07},
		/* an infinite edge takes every foot as its own: 5 and 0.5, not ~100 */
		{{0, 0, 1, INFINITY}, {-5, -100}, 5},
		{{0, 0, 1, INFINITY}, {0.5, -100}, 0.5},
		{{-INFINITY, 0, INFINITY, 1}, {3, -7}, 7},
		{{-INFINITY, -INFINITY, INFINITY, INFINITY}, {123, -456}, 0},
		{{0, 0, 1, 1}, {INFINITY, 0.5}, INFINITY},
		{{0, 0, 1, 1}, {INFINITY, INFINITY}, INFINITY},
		{{0, 0, 1, 1}, {-INFINITY, 3}, INFINITY},
		{{0, 0, 1, 1}, {NAN, 0.5}, NAN},
		{{0, 0, 1, 1}, {0.5, NAN}, NAN},
		{{0, 0, INFINITY, 1}, {NAN, 0.5}, NAN},
		{{1e300, 1e300, 1e301, 1e301}, {0, 0}, 1.4142135623730952e+300},
		{{-1e300, -1e300, 1e300, 1e300}, {1e301, 5}, 9.000000000000001e+300},
		{{1e15, 1e15, 1e15, 2e15}, {0.5, 1.5e15}, 999999999999999.5},
		{{123456789.125, 1, 123456789.25, 2}, {123456789.1875, 2.0000005}, 5.00000000069889e-07},
		{{0, 0, 1, 1}, {1.5, 1.0000000001}, 0.5},
	};
	size_t		i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		double		d = amr_dist_box_point(&cases[i].b, &cases[i].q);

		CHECK(amr_float8_eq(d, cases[i].expect) &&
			  signbit(d) == signbit(cases[i].expect),
			  "case %zu: %.17g, PostgreSQL %.17g", i, d, cases[i].expect);
	}
	return true;
}

/* point <-> point: values PostgreSQL 15.20 returned */
static bool
test_point_point_golden(void)
{
	static const struct
	{
		AmrPoint	a;
		AmrPoint	b;
		double		expect;
	}			cases[] = {
		{{0, 0}, {3, 4}, 5},
		{{0.1, 0.2}, {0.3, 0.7}, 0.5385164807134504},
		{{1e300, 1e300}, {0, 0}, 1.4142135623730952e+300},
		{{INFINITY, 0}, {0, 0}, INFINITY},
		{{INFINITY, 0}, {INFINITY, 0}, NAN},
		{{NAN, 0}, {INFINITY, 0}, NAN},
		{{NAN, 1}, {2, 3}, NAN},
		{{1e-200, 0}, {0, 1e-200}, 1.414213562373095e-200},
		{{5, 5}, {5, 5}, 0},
		{{-1e15, 3}, {1e15, -3}, 2e15},
	};
	size_t		i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		double		d = amr_dist_point_point(&cases[i].a, &cases[i].b);

		CHECK(amr_float8_eq(d, cases[i].expect), "case %zu: %.17g, PostgreSQL %.17g",
			  i, d, cases[i].expect);
	}
	return true;
}

static double
coordinate_near(double base)
{
	static const double specials[] = {
		0, 1, -1, 1e-7, 5e-7, 1e-6, 2e-6, 1e15, -1e20, 1e300, 3.4028234663852886e38,
		INFINITY, -INFINITY
	};

	switch (rng_next() % 8)
	{
		case 0:
			return base;
		case 1:
			return base + ((double) (int) (rng_next() % 41) - 20) * 1e-7;
		case 2:
			return base + ((double) (int) (rng_next() % 41) - 20) * 2.5e-8;
		case 3:
			return nextafter(base, (rng_next() & 1) ? INFINITY : -INFINITY);
		case 4:
			return base * (1 + (rnd() - 0.5) * 1e-15);
		case 5:
			return specials[rng_next() % (sizeof(specials) / sizeof(specials[0]))];
		default:
			return base + (rnd() - 0.5) * 4;
	}
}

/*
 * The property the search rests on: the bound from any float4 box covering
 * a key, and the axis bound an ordered scan queues an entry under, never
 * exceed the key's distance (box <-> point, and point <-> point for
 * degenerate keys), on boxes and points chosen to hit the EPSILON fuzz,
 * thin and infinite edges, and huge magnitudes.
 */
static bool
test_lower_bound(void)
{
	int			i;

	for (i = 0; i < 1000000; i++)
	{
		AmrBox		b;
		AmrFBox		f;
		AmrPoint	q;
		double		v[4],
					bound,
					d;
		int			j;

		for (j = 0; j < 4; j++)
			v[j] = rng_next() % 4 == 0 ? coordinate_near(0) : rnd();
		if (rng_next() % 4 == 0)
			v[1] = v[0] + (double) (rng_next() % 25) * 1e-7;	/* thin */
		if (rng_next() % 8 == 0)
			v[1] = v[0];		/* degenerate: a point key */
		b = box_of(fmin(v[0], v[1]), fmin(v[2], v[3]),
				   fmax(v[0], v[1]), fmax(v[2], v[3]));
		f = amr_fbox_from_box(&b);
		if (rng_next() % 4 == 0)
		{
			/* an inner node's box also covers other keys */
			AmrBox		other = random_row_box();
			AmrFBox		fo = amr_fbox_from_box(&other);

			amr_fbox_extend(&f, &fo);
		}
		{
			double		xs[] = {b.xlo, b.xhi, (b.xlo + b.xhi) / 2};
			double		ys[] = {b.ylo, b.yhi, (b.ylo + b.yhi) / 2};

			q.x = coordinate_near(xs[rng_next() % 3]);
			q.y = coordinate_near(ys[rng_next() % 3]);
		}
		if (isnan(q.x) || isnan(q.y) || rng_next() % 500 == 0)
			q.x = NAN;
		bound = amr_fbox_point_lower_bound(&f, &q);
		CHECK(!isnan(bound) && bound >= 0.0, "bound %g", bound);
		d = amr_dist_box_point(&b, &q);
		CHECK(!amr_float8_lt(d, bound),
			  "bound %.17g above box <-> point %.17g: box (%.17g,%.17g,%.17g,%.17g) point (%.17g,%.17g)",
			  bound, d, b.xlo, b.ylo, b.xhi, b.yhi, q.x, q.y);
		/* the entry's own bound, from its float8 key (ordered scans) */
		bound = amr_box_point_axis_bound(&b, &q);
		CHECK(!isnan(bound) && bound >= 0.0, "axis bound %g", bound);
		CHECK(!amr_float8_lt(d, bound),
			  "axis bound %.17g above box <-> point %.17g: box (%.17g,%.17g,%.17g,%.17g) point (%.17g,%.17g)",
			  bound, d, b.xlo, b.ylo, b.xhi, b.yhi, q.x, q.y);
		if (b.xlo == b.xhi && b.ylo == b.yhi)
		{
			AmrPoint	p = {b.xlo, b.ylo};

			bound = amr_fbox_point_lower_bound(&f, &q);
			d = amr_dist_point_point(&p, &q);
			CHECK(!amr_float8_lt(d, bound),
				  "bound %.17g above point <-> point %.17g: (%.17g,%.17g) (%.17g,%.17g)",
				  bound, d, p.x, p.y, q.x, q.y);
			bound = amr_point_point_axis_bound(&p, &q);
			CHECK(!amr_float8_lt(d, bound),
				  "axis bound %.17g above point <-> point %.17g: (%.17g,%.17g) (%.17g,%.17g)",
				  bound, d, p.x, p.y, q.x, q.y);
		}
	}
	return true;
}

static bool
test_knn_inserted(void)
{
	size_t		n = 12000;
	Row		   *rows;
	AmrTree    *t;
	bool		ok;

	store_init();
	rows = make_rows(n, 0);
	t = insert_rows(rows, n, 1);
	CHECK(t->height >= 2, "12000 rows should need two inner levels");
	ok = compare_with_brute_force(t, rows, n, DIST_BOX_POINT, 40, true);
	free(rows);
	store_free();
	return ok;
}

/* Leaves of up to 75 entries in STR order, inner levels packed on top. */
static AmrTree *
pack_rows(const Row *rows, size_t n, uint32_t tree_no)
{
	AmrTree    *t = &st.trees[tree_no];
	AmrPackItem *items = malloc(sizeof(AmrPackItem) * (n + 1));
	AmrPackItem *scratch = malloc(sizeof(AmrPackItem) * (n + 1));
	AmrPackItem *leaf_items = malloc(sizeof(AmrPackItem) * (n + 1));
	uint32_t   *node_ids;
	size_t		bounds[AMR_SIZE_CLASSES + 1];
	size_t		nitems = 0,
				nleaves = 0,
				nclasses,
				c,
				i;

	memset(t, 0, sizeof(*t));
	t->tree_no = tree_no;
	t->generation = 1;
	t->root = t->null_root = AMR_INVALID_NODE;
	for (i = 0; i < n; i++)
	{
		if (rows[i].isnull)
			continue;
		items[nitems].box = amr_fbox_from_box(&rows[i].b);
		items[nitems].ref = (uint32_t) i;
		nitems++;
	}
	nclasses = amr_pack_order(items, nitems, 75, scratch, bounds);
	for (c = 0; c < nclasses; c++)
	{
		size_t		first;

		for (first = bounds[c]; first < bounds[c + 1]; first += 75)
		{
			size_t		take = bounds[c + 1] - first < 75 ? bounds[c + 1] - first : 75;
			int64_t		id = amr_bitmap_alloc(st.leaf_ids_used);
			int64_t		slot = amr_bitmap_alloc(st.pmem_used);
			AmrLeaf    *leaf = amr_pmem_slot(&st, (uint32_t) slot);
			AmrFBox		mbr = amr_fbox_empty();

			amr_leaf_image_init(leaf, (uint32_t) id, tree_no, 1, 1, false);
			for (i = 0; i < take; i++)
			{
				leaf->entries[i] = make_entry(&rows[items[first + i].ref]);
				amr_fbox_extend(&mbr, &items[first + i].box);
			}
			leaf->hdr.nentries = take;
			amr_lt_publish_new(&st, (uint32_t) id, tree_no, 1, 0, AMR_INVALID_LEAF, 0,
							   AMR_TIER_PMEM, (uint32_t) slot, &mbr, leaf, 0);
			leaf_items[nleaves].box = mbr;
			leaf_items[nleaves].ref = (uint32_t) id;
			nleaves++;
		}
	}
	t->nleaves = nleaves;
	node_ids = malloc(sizeof(uint32_t) *
					  (amr_build_levels_nodes_needed(nleaves, 56) + 1));
	if (amr_build_levels(&st, t, false, leaf_items, nleaves, 56, scratch,
						 node_ids) != AMR_OK ||
		amr_build_levels(&st, t, true, leaf_items, 0, 56, scratch, node_ids) != AMR_OK)
		abort();
	free(node_ids);
	free(items);
	free(scratch);
	free(leaf_items);
	return t;
}

static bool
test_knn_packed(void)
{
	size_t		n = 30000;
	Row		   *rows;
	AmrTree    *t;
	bool		ok;

	store_init();
	rows = make_rows(n, 0);
	t = pack_rows(rows, n, 2);
	ok = compare_with_brute_force(t, rows, n, DIST_BOX_POINT, 40, true);
	free(rows);
	store_free();
	return ok;
}

/* A future point opclass: points as degenerate boxes, point <-> point. */
static bool
test_knn_points(void)
{
	size_t		n = 8000;
	Row		   *rows = malloc(sizeof(Row) * n);
	AmrTree    *t;
	size_t		i;
	bool		ok;

	store_init();
	for (i = 0; i < n; i++)
	{
		double		x = rnd(),
					y = rnd();

		if (i % 50 == 0)
			x = y = 0.5;		/* duplicates */
		else if (i % 97 == 0)
			x = INFINITY;
		rows[i].id = (uint32_t) i;
		rows[i].isnull = false;
		rows[i].b = box_of(x, y, x, y);
	}
	t = insert_rows(rows, n, 3);
	ok = compare_with_brute_force(t, rows, n, DIST_POINT_POINT, 30, false);
	free(rows);
	store_free();
	return ok;
}

/*
 * The same search object serves many queries without allocating again, and
 * gives the same answer, ties in the same order, each time.
 */
static bool
test_knn_rescan(void)
{
	size_t		n = 6000;
	Row		   *rows;
	AmrTree    *t;
	Ranked	   *expect = malloc(sizeof(Ranked) * n);
	Ranked	   *got = malloc(sizeof(Ranked) * n);
	Ranked	   *first[20];
	size_t		nfirst[20];
	AmrPoint	queries[20];
	AmrKnnSearch s;
	uint64_t	calls_first_round = 0;
	int			round,
				qn;
	bool		ok = true;

	store_init();
	rows = make_rows(n, 0);
	t = insert_rows(rows, n, 4);
	for (qn = 0; qn < 20; qn++)
		queries[qn] = random_query();
	amr_knn_init(&s, test_realloc, NULL);
	for (round = 0; round < 2 && ok; round++)
	{
		uint64_t	before = realloc_calls;

		for (qn = 0; qn < 20 && ok; qn++)
		{
			size_t		k = qn % 4 == 0 ? SIZE_MAX : (size_t) (1 + qn * 7);
			size_t		nexpect = brute_force(rows, n, UINT32_MAX, DIST_BOX_POINT,
											  &queries[qn], expect);
			KnnRun		run;

			ok = run_knn(&s, t, &queries[qn], k, DIST_BOX_POINT, UINT32_MAX, NULL,
						 got, n, &run) &&
				same_ranking(got, run.n, expect, nexpect, k, &queries[qn]);
			if (ok && round == 0)
			{
				first[qn] = malloc(sizeof(Ranked) * (run.n + 1));
				memcpy(first[qn], got, sizeof(Ranked) * run.n);
				nfirst[qn] = run.n;
			}
			else if (ok)
			{
				size_t		i;

				ok = nfirst[qn] == run.n;
				for (i = 0; ok && i < run.n; i++)
					ok = first[qn][i].id == got[i].id &&
						amr_float8_eq(first[qn][i].distance, got[i].distance);
				if (!ok)
					snprintf(failmsg, sizeof(failmsg),
							 "query %d answered differently on a rescan", qn);
				free(first[qn]);
			}
		}
		if (round == 0)
			calls_first_round = realloc_calls - before;
		else if (ok && realloc_calls != before)
		{
			snprintf(failmsg, sizeof(failmsg),
					 "rescans allocated again: %llu calls (first round %llu)",
					 (unsigned long long) (realloc_calls - before),
					 (unsigned long long) calls_first_round);
			ok = false;
		}
	}
	free(s.heap);
	free(s.returned);
	free(expect);
	free(got);
	free(rows);
	store_free();
	return ok;
}

static bool
test_knn_empty(void)
{
	AmrKnnSearch s;
	AmrKnnResult r;
	AmrPoint	q = {0.5, 0.5};
	AmrTree    *t;
	AmrTree		unbuilt;
	int			i;

	store_init();
	amr_knn_init(&s, test_realloc, NULL);

	/* a tree with its empty root */
	t = new_tree(5);
	amr_knn_begin(&s, &st, t, &q);
	CHECK(amr_knn_next_reads_tree(&s), "the first step must read the tree");
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_DONE, "empty tree returned something");
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_DONE, "DONE must repeat");

	/* NULL keys live in the other tree: the search never sees them */
	for (i = 0; i < 300; i++)
	{
		Row			row = {{0, 0, 0, 0}, true, (uint32_t) i};
		AmrLeafEntry e = make_entry(&row);

		CHECK(amr_insert_single(&st, t, &e) == AMR_OK, "insert NULL");
	}
	amr_knn_begin(&s, &st, t, &q);
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_DONE, "a tree of NULLs returned something");

	/* a tree without inner nodes at all */
	memset(&unbuilt, 0, sizeof(unbuilt));
	unbuilt.root = unbuilt.null_root = AMR_INVALID_NODE;
	amr_knn_begin(&s, &st, &unbuilt, &q);
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_DONE, "a tree without root returned something");
	free(s.heap);
	free(s.returned);
	store_free();
	return true;
}

/*
 * The recheck flag (lossy distances of future polygon and circle opclasses)
 * travels with its entry and takes no part in the order.
 */
static bool
test_knn_recheck_flag(void)
{
	AmrKnnSearch s;
	AmrKnnResult r;
	AmrPoint	q = {0, 0};
	AmrTree    *t;
	Row			row = {{1, 1, 2, 2}, false, 1};
	AmrLeafEntry e;

	store_init();
	t = new_tree(6);
	e = make_entry(&row);
	CHECK(amr_insert_single(&st, t, &e) == AMR_OK, "insert");
	amr_knn_init(&s, test_realloc, NULL);
	amr_knn_begin(&s, &st, t, &q);
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_LEAF, "expected the leaf first");
	amr_knn_add_entry(&s, 2.0, 30, 300, true);
	amr_knn_add_entry(&s, 2.0, 10, 100, false);
	amr_knn_add_entry(&s, 1.5, 20, 200, true);
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_ENTRY && r.payload == 200 && r.recheck &&
		  r.distance == 1.5, "first: payload %llu", (unsigned long long) r.payload);
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_ENTRY && r.payload == 100 && !r.recheck,
		  "second: payload %llu", (unsigned long long) r.payload);
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_ENTRY && r.payload == 300 && r.recheck &&
		  r.seq == 30, "third: payload %llu", (unsigned long long) r.payload);
	CHECK(amr_knn_next(&s, &r) == AMR_KNN_DONE, "expected the end");
	free(s.heap);
	free(s.returned);
	store_free();
	return true;
}

/*
 * Splits between the steps of a search, as concurrent inserts cause them
 * while the glue has released the tree lock: leaf splits (followed through
 * right links) and inner splits (which restart the search from the root).
 * Rows inserted meanwhile are invisible to the scan; it must return exactly
 * the rows that existed when it started, in order.
 */
static Row *concurrent_rows;
static size_t concurrent_next;
static size_t concurrent_total;

static void
insert_some(AmrTree *t, int step_no)
{
	size_t		i;

	if (step_no % 3 != 0)
		return;
	for (i = 0; i < 40 && concurrent_next < concurrent_total; i++)
	{
		AmrLeafEntry e = make_entry(&concurrent_rows[concurrent_next++]);

		if (amr_insert_single(&st, t, &e) != AMR_OK)
			abort();
	}
}

static bool
test_knn_concurrent_splits(void)
{
	size_t		n0 = 4000;
	size_t		nmore = 60000;
	Row		   *rows;
	Ranked	   *expect = malloc(sizeof(Ranked) * (n0 + nmore));
	Ranked	   *got = malloc(sizeof(Ranked) * (n0 + nmore));
	AmrKnnSearch s;
	uint64_t	restarts = 0,
				right_links = 0,
				dropped = 0;
	int			qn;
	bool		ok = true;

	amr_knn_init(&s, test_realloc, NULL);
	for (qn = 0; qn < 12 && ok; qn++)
	{
		AmrPoint	q = random_query();
		AmrTree    *t;
		size_t		nexpect;
		size_t		k = qn % 3 == 0 ? 50 : SIZE_MAX;
		KnnRun		run;

		store_init();
		rows = make_rows(n0 + nmore, 0);
		t = insert_rows(rows, n0, 7);
		concurrent_rows = rows + n0;
		concurrent_next = 0;
		concurrent_total = nmore;
		nexpect = brute_force(rows, n0, (uint32_t) n0, DIST_BOX_POINT, &q, expect);
		ok = run_knn(&s, t, &q, k, DIST_BOX_POINT, (uint32_t) n0, insert_some, got,
					 n0 + nmore, &run) &&
			same_ranking(got, run.n, expect, nexpect, k, &q);
		restarts += s.restarts;
		dropped += s.entries_dropped;
		right_links += run.right_links;
		free(rows);
		store_free();
	}
	free(s.heap);
	free(s.returned);
	free(expect);
	free(got);
	if (ok)
	{
		printf("# concurrent splits: %llu restarts, %llu right links, %llu entries dropped as returned\n",
			   (unsigned long long) restarts, (unsigned long long) right_links,
			   (unsigned long long) dropped);
		CHECK(restarts > 0 && right_links > 0,
			  "the test did not split under the search (%llu restarts, %llu right links)",
			  (unsigned long long) restarts, (unsigned long long) right_links);
	}
	return ok;
}

/*
 * The restart's bookkeeping on its own: every leaf is fed four entries at
 * distance 0 (the core takes distances as given), so the output is one
 * group of ties that comes out leaf by leaf, not in seq order.  After ten,
 * the tree's inner-node count is bumped as an inner split would bump it;
 * the search restarts at its next expansion, reads every leaf again, and
 * must drop exactly what it had returned by then -- found among the seqs it
 * kept for the current distance.
 */
static bool
test_knn_restart_drops_returned(void)
{
	size_t		n = 10000;
	Row		   *rows = malloc(sizeof(Row) * n);
	uint8_t    *returned = calloc((size_t) T_SLOTS * 4, 1);
	uint64_t	first_ten[10];
	AmrPoint	q = {0.02, 0.03};
	AmrKnnSearch s;
	AmrKnnResult r;
	AmrKnnStep	step;
	AmrTree    *t;
	size_t		nreturned = 0,
				returned_before_restart = 0,
				i;
	bool		unsorted = false;

	store_init();
	for (i = 0; i < n; i++)
	{
		double		x = rnd(),
					y = rnd();

		rows[i].id = (uint32_t) i;
		rows[i].isnull = false;
		rows[i].b = box_of(x, y, x + 0.01, y + 0.01);
	}
	t = insert_rows(rows, n, 8);
	CHECK(t->height >= 2, "the tree needs inner nodes below its root");
	amr_knn_init(&s, test_realloc, NULL);
	amr_knn_begin(&s, &st, t, &q);
	while ((step = amr_knn_next(&s, &r)) != AMR_KNN_DONE)
	{
		if (s.restarts == 1 && returned_before_restart == 0)
			returned_before_restart = nreturned;
		if (step == AMR_KNN_LEAF)
		{
			int			j;

			for (j = 0; j < 4; j++)
				amr_knn_add_entry(&s, 0.0, (uint64_t) r.leaf_id * 4 + j, 0, false);
			continue;
		}
		CHECK(r.seq < (uint64_t) T_SLOTS * 4 && !returned[r.seq],
			  "entry %llu returned twice", (unsigned long long) r.seq);
		returned[r.seq] = 1;
		if (nreturned < 10)
			first_ten[nreturned] = r.seq;
		if (++nreturned == 10)
			__atomic_add_fetch(&t->ninner, 1, __ATOMIC_RELAXED);
	}
	for (i = 1; i < 10; i++)
		unsorted |= first_ten[i] < first_ten[i - 1];
	CHECK(unsorted, "the first ten came out in seq order: nothing to test");
	CHECK(nreturned == 4 * t->nleaves, "%zu entries returned, %llu fed",
		  nreturned, (unsigned long long) (4 * t->nleaves));
	CHECK(s.restarts == 1 && s.entries_dropped == returned_before_restart,
		  "%llu restarts, %llu entries dropped, %zu returned before",
		  (unsigned long long) s.restarts, (unsigned long long) s.entries_dropped,
		  returned_before_restart);
	free(s.heap);
	free(s.returned);
	free(returned);
	free(rows);
	store_free();
	return true;
}

/*
 * The inner nodes packed again during a search, as a standby's first use
 * of a tree does after replay left them stale (amr_tree_rebuild_inner):
 * every node is freed and new levels are built from the Leaf Table, and
 * the node count comes out where it was (a coincidence the test forces).
 * The queued node ids then name freed nodes, some reused by the new levels;
 * the tree's inner_epoch must make the search restart at its next
 * expansion, and the search must return what brute force returns.
 */
static void
repack_at_step_20(AmrTree *t, int step_no)
{
	AmrPackItem *items;
	AmrPackItem *scratch;
	uint32_t   *node_ids;
	uint64_t	ninner = t->ninner;
	uint64_t	word;
	uint32_t	id;
	size_t		n = 0;

	if (step_no != 20)
		return;
	items = malloc(sizeof(AmrPackItem) * (T_SLOTS + 1));
	scratch = malloc(sizeof(AmrPackItem) * (T_SLOTS + 1));
	for (id = 0; amr_lt_next_of_tree(&st, t->tree_no, t->generation, &id, &word); id++)
	{
		items[n].box = amr_lt_mbr(&st, id, word);
		items[n].ref = id;
		n++;
	}
	node_ids = malloc(sizeof(uint32_t) * (amr_build_levels_nodes_needed(n, 56) + 1));
	amr_tree_free_nodes(&st, t);
	if (amr_build_levels(&st, t, false, items, n, 56, scratch, node_ids) != AMR_OK ||
		amr_build_levels(&st, t, true, items, 0, 56, scratch, node_ids) != AMR_OK)
		abort();
	t->ninner = ninner;
	free(node_ids);
	free(scratch);
	free(items);
}

static bool
test_knn_repack_during_search(void)
{
	size_t		n = 20000;
	Row		   *rows;
	Ranked	   *expect = malloc(sizeof(Ranked) * n);
	Ranked	   *got = malloc(sizeof(Ranked) * n);
	AmrPoint	q = {0.4, 0.6};
	AmrKnnSearch s;
	AmrTree    *t;
	size_t		nexpect;
	KnnRun		run;
	bool		ok;

	store_init();
	rows = make_rows(n, 0);
	t = insert_rows(rows, n, 8);
	CHECK(t->height >= 2, "the tree needs inner nodes below its root");
	nexpect = brute_force(rows, n, UINT32_MAX, DIST_BOX_POINT, &q, expect);
	amr_knn_init(&s, test_realloc, NULL);
	ok = run_knn(&s, t, &q, SIZE_MAX, DIST_BOX_POINT, UINT32_MAX, repack_at_step_20, got, n,
				 &run) &&
		same_ranking(got, run.n, expect, nexpect, SIZE_MAX, &q);
	CHECK(!ok || s.restarts == 1, "%llu restarts after one repack",
		  (unsigned long long) s.restarts);
	free(s.heap);
	free(s.returned);
	free(expect);
	free(got);
	free(rows);
	store_free();
	return ok;
}

/*
 * Entries fed under bounds and refined at the head of the queue (the box_ops
 * path of amr_scan.c) give the same answers as entries fed with their
 * distances: on inserted and packed trees, with splits during the search,
 * and across restarts.  And most entries are never refined.
 */
static bool
test_knn_bounds(void)
{
	bool		ok;

	lazy_feed = true;
	refines = 0;
	ok = test_knn_inserted() && test_knn_packed() && test_knn_concurrent_splits() &&
		test_knn_restart_drops_returned();
	lazy_feed = false;
	CHECK(ok, "a search with entries fed under bounds went wrong");
	CHECK(refines > 0, "no entry was refined: the bound path was not exercised");
	return true;
}

int
main(void)
{
	static const TestCase tests[] = {
		{"knn_box_point_distance_matches_postgres", test_box_point_golden},
		{"knn_point_point_distance_matches_postgres", test_point_point_golden},
		{"knn_lower_bounds_hold", test_lower_bound},
		{"knn_inserted_tree_matches_brute_force", test_knn_inserted},
		{"knn_packed_tree_matches_brute_force", test_knn_packed},
		{"knn_points_match_brute_force", test_knn_points},
		{"knn_rescan_reuses_memory", test_knn_rescan},
		{"knn_empty_trees", test_knn_empty},
		{"knn_recheck_flag_carried", test_knn_recheck_flag},
		{"knn_splits_during_search", test_knn_concurrent_splits},
		{"knn_restart_drops_what_was_returned", test_knn_restart_drops_returned},
		{"knn_repack_during_search_restarts", test_knn_repack_during_search},
		{"knn_entries_fed_under_bounds", test_knn_bounds},
	};

	return run_tests(tests, sizeof(tests) / sizeof(tests[0]), AMR_PERSIST_NOP, "amr_knn_test");
}
