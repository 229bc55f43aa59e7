/*
 * amr_core_test.c
 *		Unit tests of the PostgreSQL-free tree core, run without a server.
 *
 * The core is driven on ordinary memory standing in for the pool: inserts
 * with splits, bulk packing and rebuilds are compared against brute force
 * over every stored entry, and the structural checker must hold throughout.
 * Prints "ok <name>" / "FAIL <name>" per test and a closing line.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "amr_persist.h"
#include "amr_policy.h"
#include "amr_ssd.h"
#include "amr_tree.h"

#define T_SLOTS 60000
#define T_NODES 20000
#define RNG_SEED 12345
#include "amr_test_support.h"

/* ---- data ---- */


static AmrBox
random_box(int kind)
{
	AmrBox		b;
	double		x = rnd(),
				y = rnd();

	switch (kind)
	{
		case 0:					/* point */
			b.xlo = b.xhi = x;
			b.ylo = b.yhi = y;
			break;
		case 1:					/* huge */
			b.xlo = -1e300;
			b.ylo = y - 1e200;
			b.xhi = x * 1e300;
			b.yhi = 1e250;
			break;
		case 2:					/* infinite */
			b.xlo = -INFINITY;
			b.ylo = y;
			b.xhi = x;
			b.yhi = INFINITY;
			break;
		case 3:					/* duplicate of a fixed box */
			b.xlo = 0.25;
			b.ylo = 0.25;
			b.xhi = 0.2500004;	/* within EPSILON of the corner: fuzzy */
			b.yhi = 0.26;
			break;
		default:
			b.xlo = x;
			b.ylo = y;
			b.xhi = x + rnd() * 0.01;
			b.yhi = y + rnd() * 0.01;
	}
	return b;
}

static int
row_kind(void)
{
	uint64_t	r = rng_next() % 1000;

	if (r < 20)
		return 0;
	if (r < 23)
		return 1;
	if (r < 26)
		return 2;
	if (r < 60)
		return 3;
	return 4;
}

/* Every leaf of a scan's candidates, entries tested exactly: the rows. */
static size_t
index_search(AmrTree *t, const AmrScanKey *k, uint8_t *hit, size_t nrows)
{
	AmrLeafList list = {NULL, 0, 0};
	size_t		found = 0;
	uint32_t	i;

	memset(hit, 0, nrows);
	amr_collect_leaves(&st, t, false, k, 1, &list, NULL, NULL, test_realloc, NULL);
	for (i = 0; i < list.n; i++)
	{
		uint64_t	w = amr_lt_word(&st, list.ids[i]);
		AmrLeaf    *leaf = amr_pmem_slot(&st, AMR_WORD_SLOT(w));
		uint64_t	j;

		for (j = 0; j < leaf->hdr.nentries; j++)
		{
			const AmrLeafEntry *e = &leaf->entries[j];

			if (!(e->flags & AMR_ENTRY_FLAG_NULL) &&
				amr_leaf_match(k->strategy, &e->key, &k->query))
			{
				hit[entry_row(e)]++;
				found++;
			}
		}
	}
	free(list.ids);
	return found;
}

static AmrBox
random_query(void)
{
	AmrBox		q;
	double		x = rnd() * 1.1 - 0.05,
				y = rnd() * 1.1 - 0.05;
	double		w = rnd() < 0.2 ? rnd() * 0.5 : rnd() * 0.05;

	q.xlo = x;
	q.ylo = y;
	q.xhi = x + w;
	q.yhi = y + w * (0.5 + rnd());
	if (rng_next() % 10 == 0)
	{
		/* hit the duplicates exactly, or within the fuzz */
		q.xlo = 0.25;
		q.ylo = 0.25;
		q.xhi = 0.2500009;
		q.yhi = 0.26;
	}
	return q;
}

/* Compare index search with brute force for all strategies. */
static bool
compare_searches(AmrTree *t, const Row *rows, size_t nrows, int nqueries)
{
	uint8_t    *hit = malloc(nrows);
	int			qn,
				s;

	for (qn = 0; qn < nqueries; qn++)
	{
		AmrBox		q = random_query();

		for (s = 1; s <= AMR_NUM_STRATEGIES; s++)
		{
			AmrScanKey	k = {s, true, q};
			size_t		i;
			size_t		expect = 0;
			size_t		got = index_search(t, &k, hit, nrows);

			for (i = 0; i < nrows; i++)
			{
				bool		m = !rows[i].isnull && amr_leaf_match(s, &rows[i].b, &q);

				if (m)
					expect++;
				if ((m ? 1 : 0) != hit[i])
				{
					int			got_hits = hit[i];

					free(hit);
					CHECK(false, "strategy %d query (%g,%g,%g,%g): row %zu expected %d got %d",
						  s, q.xlo, q.ylo, q.xhi, q.yhi, i, m, got_hits);
				}
			}
			CHECK(got == expect, "strategy %d: %zu vs %zu rows", s, got, expect);
		}
	}
	free(hit);
	return true;
}

/* ---- tests ---- */

static bool
test_bitmap(void)
{
	AmrBitmap  *bm = malloc(amr_bitmap_size(130));
	int			i;
	int64_t		b;

	amr_bitmap_init(bm, 130);
	for (i = 0; i < 130; i++)
		CHECK(amr_bitmap_alloc(bm) >= 0, "alloc %d failed", i);
	CHECK(amr_bitmap_alloc(bm) == -1, "bitmap over-allocated");
	CHECK(amr_bitmap_count(bm) == 130, "count %llu", (unsigned long long) amr_bitmap_count(bm));
	CHECK(amr_bitmap_clear(bm, 77), "clear failed");
	CHECK(!amr_bitmap_clear(bm, 77), "double clear succeeded");
	b = amr_bitmap_alloc(bm);
	CHECK(b == 77, "expected to reuse 77, got %lld", (long long) b);
	CHECK(!amr_bitmap_set(bm, 5), "set of a used bit succeeded");
	CHECK(!amr_bitmap_test(bm, 200), "bit beyond the end reported used");
	free(bm);
	return true;
}

static bool
test_rounding(void)
{
	int			i;

	for (i = 0; i < 200000; i++)
	{
		AmrBox		b = random_box(row_kind());
		AmrFBox		f;

		b.xlo = b.xlo * (rnd() * 1e6);
		b.xhi = fmax(b.xhi * (rnd() * 1e6), b.xlo);
		f = amr_fbox_from_box(&b);
		CHECK(f.xlo <= b.xlo && f.ylo <= b.ylo && f.xhi >= b.xhi && f.yhi >= b.yhi,
			  "float4 box does not cover (%g,%g,%g,%g)", b.xlo, b.ylo, b.xhi, b.yhi);
	}
	/* the inline float steps are libm's nextafterf, at every kind of float */
	for (i = 0; i < 400000; i++)
	{
		static const float specials[] = {0.0f, -0.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN,
		-FLT_MIN, FLT_MAX, -FLT_MAX, 1.0f, -1.0f, INFINITY, -INFINITY};
		uint32_t	u = (uint32_t) rng_next();
		float		f;
		float		ours;
		float		libm;

		memcpy(&f, &u, sizeof(f));
		if (i < 12)
			f = specials[i];
		if (isnan(f))
			continue;
		/* compared bit for bit: -0.0f and 0.0f must not pass for each other */
		if (f != -INFINITY)
		{
			ours = amr_float_below(f);
			libm = nextafterf(f, -INFINITY);
			CHECK(memcmp(&ours, &libm, sizeof(float)) == 0 ||
				  (f == 0.0f && ours == -FLT_TRUE_MIN),
				  "float below %a: %a, nextafterf %a", f, ours, libm);
		}
		if (f != INFINITY)
		{
			ours = amr_float_above(f);
			libm = nextafterf(f, INFINITY);
			CHECK(memcmp(&ours, &libm, sizeof(float)) == 0 ||
				  (f == 0.0f && ours == FLT_TRUE_MIN),
				  "float above %a: %a, nextafterf %a", f, ours, libm);
		}
	}
	return true;
}

/*
 * The property pruning rests on: whenever a key inside a bounding box
 * matches, the bounding box (rounded outward to float4) passes the inner
 * test.  Coordinates are drawn near each other so that the EPSILON fuzz and
 * equalities are exercised.
 */
static bool
test_inner_is_conservative(void)
{
	static const double specials[] = {0, 1e-7, -1e-7, 5e-7, 1e-6, 2e-6, 1, -1, INFINITY, -INFINITY, 1e300};
	int			i,
				s;

	for (i = 0; i < 300000; i++)
	{
		double		v[8];
		AmrBox		k,
					m,
					q;
		AmrFBox		fm;
		int			j;

		for (j = 0; j < 8; j++)
			v[j] = rng_next() % 4 == 0 ? specials[rng_next() % 11]
				: floor(rnd() * 8) * 5e-7;
		k.xlo = fmin(v[0], v[1]);
		k.xhi = fmax(v[0], v[1]);
		k.ylo = fmin(v[2], v[3]);
		k.yhi = fmax(v[2], v[3]);
		m.xlo = k.xlo - (rng_next() % 2) * 1e-6;
		m.ylo = k.ylo - (rng_next() % 2) * 3e-7;
		m.xhi = k.xhi + (rng_next() % 2) * 1e-6;
		m.yhi = k.yhi;
		q.xlo = fmin(v[4], v[5]);
		q.xhi = fmax(v[4], v[5]);
		q.ylo = fmin(v[6], v[7]);
		q.yhi = fmax(v[6], v[7]);
		fm = amr_fbox_from_box(&m);
		for (s = 1; s <= AMR_NUM_STRATEGIES; s++)
			CHECK(!amr_leaf_match(s, &k, &q) || amr_inner_match(s, &fm, &q),
				  "strategy %d prunes a match: key (%g,%g,%g,%g) query (%g,%g,%g,%g)",
				  s, k.xlo, k.ylo, k.xhi, k.yhi, q.xlo, q.ylo, q.xhi, q.yhi);
	}
	return true;
}

/*
 * amr_collect_leaves answers a single `&&` or `<@` key with float
 * thresholds found once per search instead of amr_inner_match per entry:
 * the leaves it collects from one level-1 node must be exactly those whose
 * entry boxes amr_inner_match passes, with bounds and queries on either side
 * of each threshold (within epsilon, at denormal spacing near zero, huge,
 * infinite).
 */
static bool
test_overlap_fast_path(void)
{
	static const double specials[] = {0, 1e-6, -1e-6, 1e-7, -1e-45, 1e-40, 3.4e38, 1e300,
	INFINITY, -INFINITY, 0.25, 1};
	static AmrInnerNode node;
	AmrStore	store;
	AmrTree		tree;
	int			round;

	memset(&store, 0, sizeof(store));
	memset(&tree, 0, sizeof(tree));
	store.nodes = &node;
	tree.root = 0;
	tree.null_root = AMR_INVALID_NODE;
	for (round = 0; round < 20000; round++)
	{
		AmrScanKey	key;
		AmrLeafList list = {NULL, 0, 0};
		double		v[4];
		int			i,
					j;
		uint32_t	got = 0;

		for (j = 0; j < 4; j++)
		{
			double		base = specials[rng_next() % 12];

			v[j] = rng_next() % 3 == 0 ? base
				: base + ((double) (rng_next() % 5) - 2.0) * (rng_next() % 2 ? 5e-7 : 1e-45);
		}
		key.strategy = rng_next() % 2 ? AMR_STRAT_OVERLAP : AMR_STRAT_CONTAINED_BY;
		key.prune = true;
		key.query.xlo = fmin(v[0], v[1]);
		key.query.xhi = fmax(v[0], v[1]);
		key.query.ylo = fmin(v[2], v[3]);
		key.query.yhi = fmax(v[2], v[3]);
		node.level = 1;
		node.count = AMR_INNER_FANOUT;
		for (i = 0; i < AMR_INNER_FANOUT; i++)
		{
			/* bounds on the query's own values, a float step or epsilon away */
			float		f[4];

			for (j = 0; j < 4; j++)
			{
				double		base = rng_next() % 4 == 0 ? specials[rng_next() % 12] : v[rng_next() % 4];
				float		b = (float) (base + ((double) (rng_next() % 3) - 1.0) *
										 (rng_next() % 2 ? 1e-6 : 0));
				int			steps = (int) (rng_next() % 5) - 2;

				for (; steps > 0; steps--)
					b = nextafterf(b, INFINITY);
				for (; steps < 0; steps++)
					b = nextafterf(b, -INFINITY);
				f[j] = b;
			}
			node.xlo[i] = fminf(f[0], f[1]);
			node.xhi[i] = fmaxf(f[0], f[1]);
			node.ylo[i] = fminf(f[2], f[3]);
			node.yhi[i] = fmaxf(f[2], f[3]);
			node.child[i] = (uint32_t) i;
		}
		amr_collect_leaves(&store, &tree, false, &key, 1, &list, NULL, NULL, test_realloc, NULL);
		for (i = 0; i < AMR_INNER_FANOUT; i++)
		{
			AmrFBox		b = amr_node_entry_box(&node, i);
			bool		want = amr_inner_match(key.strategy, &b, &key.query);
			bool		found = got < list.n && list.ids[got] == (uint32_t) i;

			if (found)
				got++;
			CHECK(want == found,
				  "entry (%a,%a,%a,%a) query (%a,%a,%a,%a) strategy %d: inner test %d, collected %d",
				  b.xlo, b.ylo, b.xhi, b.yhi, key.query.xlo, key.query.ylo,
				  key.query.xhi, key.query.yhi, key.strategy, want, found);
		}
		CHECK(got == list.n, "collected %u leaves, matched %u", list.n, got);
		free(list.ids);
	}
	return true;
}

/*
 * Keys with NaN coordinates: a box operator holds only through the key's
 * other coordinates (every comparison with NaN is false), so the key's
 * bounding box, infinite on its NaN sides, must pass the inner test
 * whenever the key matches a query without NaN; and no NaN may reach the
 * bounding box.
 */
static bool
test_nan_keys_prune_safely(void)
{
	static const double specials[] = {0, 1e-7, -1e-7, 1e-6, 1, -1, INFINITY, -INFINITY, NAN};
	int			i,
				s;

	for (i = 0; i < 200000; i++)
	{
		double		v[8];
		AmrBox		k,
					q;
		AmrFBox		fk;
		int			j;

		for (j = 0; j < 8; j++)
			v[j] = rng_next() % 4 == 0 ? specials[rng_next() % 8]
				: floor(rnd() * 8) * 5e-7;
		q.xlo = fmin(v[4], v[5]);
		q.xhi = fmax(v[4], v[5]);
		q.ylo = fmin(v[6], v[7]);
		q.yhi = fmax(v[6], v[7]);
		k.xlo = fmin(v[0], v[1]);
		k.xhi = fmax(v[0], v[1]);
		k.ylo = fmin(v[2], v[3]);
		k.yhi = fmax(v[2], v[3]);
		/* one to four NaN coordinates, anywhere */
		for (j = 0; j < 4; j++)
			if (j == 0 || rng_next() % 3 == 0)
				((double *) &k)[rng_next() % 4] = NAN;
		fk = amr_fbox_from_box(&k);
		CHECK(!isnan(fk.xlo) && !isnan(fk.ylo) && !isnan(fk.xhi) && !isnan(fk.yhi),
			  "a NaN reached the bounding box of (%g,%g,%g,%g)", k.xlo, k.ylo, k.xhi, k.yhi);
		for (s = 1; s <= AMR_NUM_STRATEGIES; s++)
			CHECK(!amr_leaf_match(s, &k, &q) || amr_inner_match(s, &fk, &q),
				  "strategy %d prunes a match: key (%g,%g,%g,%g) query (%g,%g,%g,%g)",
				  s, k.xlo, k.ylo, k.xhi, k.yhi, q.xlo, q.ylo, q.xhi, q.yhi);
	}
	return true;
}

static bool
test_rstar_split(void)
{
	int			round;

	for (round = 0; round < 2000; round++)
	{
		AmrFBox		boxes[AMR_LEAF_CAPACITY + 1];
		uint8_t		right[AMR_LEAF_CAPACITY + 1];
		int			n = (int) AMR_LEAF_CAPACITY + 1;
		int			min_fill = n * 2 / 5;
		int			i,
					nr = 0;

		for (i = 0; i < n; i++)
		{
			AmrBox		b = random_box(round % 3 == 0 ? 3 : row_kind());

			boxes[i] = amr_fbox_from_box(&b);
		}
		amr_rstar_split(boxes, n, min_fill, right);
		for (i = 0; i < n; i++)
			nr += right[i] ? 1 : 0;
		CHECK(nr >= min_fill && n - nr >= min_fill, "unbalanced split %d/%d", nr, n - nr);
	}
	return true;
}

/*
 * amr_leaf_image_mbr rounds the float8 union once; it must equal the union
 * of the entries' own rounded boxes, whatever the keys (NaN,
 * infinite, huge, points, NULL and dead entries left out).
 */
static bool
test_leaf_mbr_is_union(void)
{
	static AmrLeaf leaf;
	int			round;

	for (round = 0; round < 20000; round++)
	{
		int			n = (int) (rng_next() % (AMR_LEAF_CAPACITY + 1));
		AmrFBox		want = amr_fbox_empty();
		AmrFBox		got;
		int			i;

		amr_leaf_image_init(&leaf, 7, 1, 1, 3, false);
		for (i = 0; i < n; i++)
		{
			Row			r = {random_box(row_kind()), false, (uint32_t) i};
			uint64_t	pick = rng_next() % 100;

			if (pick < 3)
				r.b.xlo = NAN;
			else if (pick < 6)
				r.b.yhi = NAN;
			else if (pick < 8)
				r.b.ylo = r.b.xhi = NAN;
			leaf.entries[i] = make_entry(&r);
			if (pick >= 95)
				leaf.entries[i].flags |= (pick & 1) ? AMR_ENTRY_FLAG_DEAD : AMR_ENTRY_FLAG_NULL;
			if (!(leaf.entries[i].flags & (AMR_ENTRY_FLAG_NULL | AMR_ENTRY_FLAG_DEAD)))
			{
				AmrFBox		b = amr_fbox_from_box(&leaf.entries[i].key);

				amr_fbox_extend(&want, &b);
			}
		}
		leaf.hdr.nentries = n;
		got = amr_leaf_image_mbr(&leaf);
		/* == rather than memcmp: a union may keep 0 where the other keeps -0 */
		CHECK(got.xlo == want.xlo && got.ylo == want.ylo && got.xhi == want.xhi &&
			  got.yhi == want.yhi,
			  "round %d, %d entries: (%a,%a,%a,%a) instead of (%a,%a,%a,%a)", round, n,
			  got.xlo, got.ylo, got.xhi, got.yhi, want.xlo, want.ylo, want.xhi, want.yhi);
	}
	return true;
}

static bool
test_checksum(void)
{
	static AmrLeaf leaf;
	int			i;

	amr_leaf_image_init(&leaf, 7, 1, 1, 3, false);
	for (i = 0; i < 10; i++)
	{
		Row			r = {random_box(4), false, (uint32_t) i};

		leaf.entries[i] = make_entry(&r);
	}
	leaf.hdr.nentries = 10;
	amr_leaf_image_set_checksum(&leaf);
	CHECK(amr_leaf_image_checksum_ok(&leaf), "fresh checksum does not verify");
	leaf.entries[3].key.xlo += 1.0;
	CHECK(!amr_leaf_image_checksum_ok(&leaf), "corruption not detected");
	CHECK(amr_crc32c("123456789", 9) == 0xE3069283u, "CRC-32C check value");
	return true;
}

/*
 * An error in a batch of slot transfers names the slot that failed, not
 * the batch's first: a file size limit makes the write of one slot in the
 * middle fail (EFBIG), with pread/pwrite and with io_uring.
 */
static bool
test_ssd_batch_error_slot(void)
{
	static AmrLeaf bufs[4] __attribute__((aligned(AMR_SLOT_SIZE)));
	const uint32_t slots[4] = {0, 1, 10, 2};
	void	   *ptrs[4] = {&bufs[0], &bufs[1], &bufs[2], &bufs[3]};
	char		path[] = "/tmp/amr_core_test_ssd_XXXXXX";
	struct rlimit old_limit;
	struct rlimit limit;
	int			m;

	CHECK(getrlimit(RLIMIT_FSIZE, &old_limit) == 0, "getrlimit");
	signal(SIGXFSZ, SIG_IGN);
	for (m = 0; m < 2; m++)
	{
		AmrSsdIo	io = {-1, m == 0 ? AMR_IO_SYNC : AMR_IO_URING, AMR_SSD_SYNC_NONE,
		false, NULL, 0, 0};
		int			failed = 99;
		int			rc;

		io.fd = mkstemp(path);
		CHECK(io.fd >= 0, "mkstemp");
		unlink(path);
		strcpy(path + strlen(path) - 6, "XXXXXX");
		limit = old_limit;
		limit.rlim_cur = amr_ssd_offset(4);
		CHECK(setrlimit(RLIMIT_FSIZE, &limit) == 0, "setrlimit");
		rc = amr_ssd_write_slots(&io, slots, ptrs, 4, &failed);
		setrlimit(RLIMIT_FSIZE, &old_limit);
		CHECK(rc == -EFBIG, "method %d: write returned %d, not -EFBIG", m, rc);
		CHECK(failed == 2, "method %d: failed slot index %d, not 2", m, failed);
		rc = amr_ssd_read_slots(&io, slots, ptrs, 4, &failed);
		CHECK(rc == -EIO && failed == 2, "method %d: read returned %d for index %d", m, rc, failed);
		amr_ssd_io_close(&io);
		close(io.fd);
	}
	signal(SIGXFSZ, SIG_DFL);
	return true;
}

static Row *
make_rows(size_t n)
{
	Row		   *rows = malloc(sizeof(Row) * n);
	size_t		i;

	for (i = 0; i < n; i++)
	{
		rows[i].id = (uint32_t) i;
		rows[i].isnull = rng_next() % 200 == 0;
		rows[i].b = random_box(row_kind());
	}
	return rows;
}

static bool
check_structure(AmrTree *t)
{
	uint8_t    *seen = malloc(st.lt_capacity);
	char		buf[512];
	const char *problem = amr_check_tree(&st, t, seen, buf, sizeof(buf));

	free(seen);
	CHECK(problem == NULL, "amr_check_tree: %s", problem);
	return true;
}

static bool
test_insert_and_search(void)
{
	size_t		n = 150000;
	Row		   *rows = make_rows(n);
	AmrTree    *t;
	size_t		i;
	bool		ok;

	store_init();
	t = new_tree(1);
	for (i = 0; i < n; i++)
	{
		AmrLeafEntry e = make_entry(&rows[i]);

		CHECK(amr_insert_single(&st, t, &e) == AMR_OK, "insert %zu failed", i);
		if ((i == 1000 || i == 20000) && !check_structure(t))
			return false;
	}
	CHECK(t->nentries == n, "tree counts %llu entries, inserted %zu",
		  (unsigned long long) t->nentries, n);
	CHECK(t->height >= 2, "150k entries should need two inner levels");
	ok = check_structure(t) && compare_searches(t, rows, n, 60);

	/* rebuild the inner nodes from the Leaf Table alone, as at startup */
	if (ok)
	{
		AmrPackItem *items = malloc(sizeof(AmrPackItem) * st.lt_capacity);
		AmrPackItem *scratch = malloc(sizeof(AmrPackItem) * st.lt_capacity);
		uint32_t   *node_ids = malloc(sizeof(uint32_t) * st.lt_capacity);
		size_t		nb = 0,
					nn = 0;
		uint32_t	id;

		amr_tree_free_nodes(&st, t);
		for (id = 0; id < st.lt_capacity; id++)
		{
			uint64_t	w = amr_lt_word(&st, id);

			if (AMR_WORD_TIER(w) == AMR_TIER_NONE || (st.lt[id].flags & AMR_LT_FLAG_NULLS))
				continue;
			items[nb].box = amr_lt_mbr(&st, id, w);
			items[nb++].ref = id;
		}
		CHECK(amr_build_levels(&st, t, false, items, nb, 56, scratch, node_ids) == AMR_OK,
			  "rebuild of the box side failed");
		for (id = 0; id < st.lt_capacity; id++)
		{
			uint64_t	w = amr_lt_word(&st, id);

			if (AMR_WORD_TIER(w) == AMR_TIER_NONE || !(st.lt[id].flags & AMR_LT_FLAG_NULLS))
				continue;
			items[nn].box = (AmrFBox)
			{
				0, 0, 0, 0
			};
			items[nn++].ref = id;
		}
		CHECK(amr_build_levels(&st, t, true, items, nn, 56, scratch, node_ids) == AMR_OK,
			  "rebuild of the NULL side failed");
		free(items);
		free(scratch);
		free(node_ids);
		ok = check_structure(t) && compare_searches(t, rows, n, 30);
		if (ok)
		{
			/* and the rebuilt tree keeps taking inserts */
			for (i = 0; i < 5000; i++)
			{
				AmrLeafEntry e = make_entry(&rows[i]);

				CHECK(amr_insert_single(&st, t, &e) == AMR_OK, "insert after rebuild");
			}
			ok = check_structure(t);
		}
	}
	free(rows);
	store_free();
	return ok;
}

/*
 * The build's point packing: a permutation of the input; the same size
 * classes, class by class, as amr_pack_order gives the same boxes; within
 * a class, STR slices in x order, each in y order.
 */
static bool
test_point_pack(void)
{
	size_t		n = 30011;
	int			per = 75;
	AmrPackItem *items = malloc(sizeof(AmrPackItem) * n);
	AmrPackItem *scratch = malloc(sizeof(AmrPackItem) * n);
	AmrPackPoint *pts = malloc(sizeof(AmrPackPoint) * n);
	AmrPackPoint *pscratch = malloc(sizeof(AmrPackPoint) * n);
	AmrFBox    *boxes = malloc(sizeof(AmrFBox) * n);
	uint8_t    *cls = malloc(n);
	uint8_t    *seen = calloc(n, 1);
	double		sample[1024];
	size_t		nsample = 0;
	size_t		bounds[AMR_SIZE_CLASSES + 1];
	size_t		pbounds[AMR_SIZE_CLASSES + 1];
	size_t		nclasses,
				npclasses,
				i,
				c;
	double		base;
	bool		ok = true;

	for (i = 0; i < n; i++)
	{
		/* mostly small boxes, some long ones, some points and huge ones */
		AmrBox		b = random_box(i % 97 == 0 ? 1 : i % 89 == 0 ? 2 : i % 13 == 0 ? 0 :
								   i % 7 == 0 ? 3 : 4);

		if (i % 11 == 0)
			b.xhi = b.xlo + 0.3;	/* long boxes: a class of their own */

		boxes[i] = amr_fbox_from_box(&b);
		items[i].box = boxes[i];
		items[i].ref = (uint32_t) i;
	}
	for (i = 0; i < n && nsample < 1024; i += n / 1024 + 1)
		sample[nsample++] = amr_pack_extent(&boxes[i]);
	base = amr_pack_class_base(sample, nsample);
	for (i = 0; i < n; i++)
	{
		pts[i] = amr_pack_point(&boxes[i], (uint32_t) i);
		cls[i] = (uint8_t) amr_pack_size_class(&boxes[i], base);
	}
	nclasses = amr_pack_order(items, n, (size_t) per, scratch, bounds);
	npclasses = amr_pack_points_order(pts, cls, n, (size_t) per, pscratch, pbounds);
	CHECK(nclasses == npclasses && nclasses > 1, "class counts differ");
	for (c = 0; c <= nclasses; c++)
		CHECK(bounds[c] == pbounds[c], "class bounds differ");
	for (i = 0; i < n; i++)
	{
		CHECK(pts[i].ref < n && !seen[pts[i].ref], "not a permutation");
		seen[pts[i].ref] = 1;
	}
	for (c = 0; c < nclasses && ok; c++)
	{
		size_t		len = pbounds[c + 1] - pbounds[c];
		size_t		groups = (len + per - 1) / per;
		size_t		slice = (size_t) ceil(sqrt((double) groups)) * per;
		size_t		first;

		for (i = pbounds[c]; i < pbounds[c + 1]; i++)
		{
			CHECK(cls[pts[i].ref] == cls[pts[pbounds[c]].ref], "a class mixes sizes");
			CHECK(c == 0 || cls[pts[i].ref] > cls[pts[pbounds[c] - 1].ref], "classes out of order");
			CHECK(cls[pts[i].ref] == amr_pack_size_class(&items[i].box, base),
				  "classes differ at a position");
		}
		if (len <= (size_t) per)
			continue;
		for (first = 0; first < len; first += slice)
		{
			size_t		end = first + slice < len ? first + slice : len;

			for (i = first + 1; i < end; i++)
				CHECK(pts[pbounds[c] + i - 1].ykey <= pts[pbounds[c] + i].ykey,
					  "slice not in y order");
			if (end < len)
			{
				uint32_t	maxx = 0,
							minx = UINT32_MAX;

				for (i = first; i < end; i++)
					maxx = pts[pbounds[c] + i].xkey > maxx ? pts[pbounds[c] + i].xkey : maxx;
				for (i = end; i < (end + slice < len ? end + slice : len); i++)
					minx = pts[pbounds[c] + i].xkey < minx ? pts[pbounds[c] + i].xkey : minx;
				CHECK(maxx <= minx, "slices not in x order");
			}
		}
	}
	/* keys keep the centres' order */
	for (i = 1; i < n; i++)
	{
		AmrPackPoint a = amr_pack_point(&boxes[i - 1], 0);
		AmrPackPoint b = amr_pack_point(&boxes[i], 0);
		float		ax = (float) amr_fbox_center_x(&boxes[i - 1]);
		float		bx = (float) amr_fbox_center_x(&boxes[i]);

		CHECK(!(ax < bx) || a.xkey < b.xkey, "x keys out of order");
		CHECK(!(a.xkey < b.xkey) || ax <= bx, "x keys out of order");
	}
	free(items);
	free(scratch);
	free(pts);
	free(pscratch);
	free(boxes);
	free(cls);
	free(seen);
	return ok;
}

static bool
test_bulk_pack(void)
{
	size_t		n = 40000;
	AmrPackItem *items = malloc(sizeof(AmrPackItem) * n);
	AmrPackItem *scratch = malloc(sizeof(AmrPackItem) * n);
	uint32_t   *ids;
	AmrTree    *t;
	size_t		i;
	bool		ok;
	AmrScanKey	k;
	AmrLeafList list = {NULL, 0, 0};
	size_t		expect = 0;

	store_init();
	t = &st.trees[2];
	memset(t, 0, sizeof(*t));
	t->tree_no = 2;
	t->generation = 1;
	t->root = t->null_root = AMR_INVALID_NODE;
	/* publish n single-entry leaves with known boxes */
	for (i = 0; i < n; i++)
	{
		AmrBox		b = random_box(4);
		AmrFBox		f = amr_fbox_from_box(&b);
		int64_t		id = amr_bitmap_alloc(st.leaf_ids_used);
		int64_t		slot = amr_bitmap_alloc(st.pmem_used);
		AmrLeaf    *leaf = amr_pmem_slot(&st, (uint32_t) slot);

		amr_leaf_image_init(leaf, (uint32_t) id, 2, 1, 1, false);
		leaf->hdr.nentries = 0;
		amr_lt_publish_new(&st, (uint32_t) id, 2, 1, 0, AMR_INVALID_LEAF, 0,
						   AMR_TIER_PMEM, (uint32_t) slot, &f, leaf, 0);
		items[i].box = f;
		items[i].ref = (uint32_t) id;
	}
	ids = malloc(sizeof(uint32_t) * amr_build_levels_nodes_needed(n, 50));
	CHECK(amr_build_levels(&st, t, false, items, n, 50, scratch, ids) == AMR_OK, "pack failed");
	CHECK(amr_build_levels(&st, t, true, items, 0, 50, scratch, ids) == AMR_OK, "empty pack failed");
	ok = check_structure(t);

	/* the collected candidates are exactly the leaves whose box passes */
	k.strategy = AMR_STRAT_OVERLAP;
	k.prune = true;
	k.query = (AmrBox)
	{
		0.3, 0.3, 0.35, 0.4
	};
	amr_collect_leaves(&st, t, false, &k, 1, &list, NULL, NULL, test_realloc, NULL);
	for (i = 0; i < st.lt_capacity; i++)
	{
		uint64_t	w = amr_lt_word(&st, (uint32_t) i);
		AmrFBox		f;

		if (AMR_WORD_TIER(w) == AMR_TIER_NONE)
			continue;
		f = amr_lt_mbr(&st, (uint32_t) i, w);
		if (amr_inner_match(k.strategy, &f, &k.query))
			expect++;
	}
	if (ok && list.n < expect)
	{
		snprintf(failmsg, sizeof(failmsg), "collected %u leaves, %zu match", list.n, expect);
		ok = false;
	}
	free(list.ids);
	free(ids);
	free(items);
	free(scratch);
	store_free();
	return ok;
}

/* DRAM exhaustion fails cleanly and leaves no node behind. */
static bool
test_dram_full(void)
{
	AmrTree    *t;
	AmrReservation r;
	uint64_t	before;
	int			i;

	store_init();
	t = new_tree(3);
	for (i = 0; i < T_NODES; i++)
	{
		uint32_t	n;

		if (amr_node_alloc(&st, &n, 1) != AMR_OK)
			break;
	}
	before = amr_bitmap_count(st.nodes_used);
	CHECK(amr_reserve(&st, 1, AMR_TIER_PMEM, AMR_TIER_PMEM, false, &r) == AMR_ERR_DRAM_FULL, "reservation should fail");
	CHECK(amr_bitmap_count(st.nodes_used) == before, "failed reservation leaked nodes");
	CHECK(amr_bitmap_count(st.pmem_used) == 0, "failed reservation leaked slots");
	CHECK(amr_bitmap_count(st.leaf_ids_used) == 0, "failed reservation leaked leaf ids");
	/* a tree's first leaf needs no inner node: still possible */
	{
		Row			row = {random_box(4), false, 1};
		AmrLeafEntry e = make_entry(&row);

		CHECK(amr_insert_single(&st, t, &e) == AMR_OK, "first leaf without DRAM");
		CHECK(t->nentries == 1, "entry not counted");
	}
	store_free();
	return true;
}

/*
 * The reserve rule (AmrSlotPurpose): with few slots free, adding stops at
 * the reserve, replacing may use it, migrating never goes to the other
 * tier, and a full tier falls back to the other one where allowed.
 */
static bool
test_slot_purposes(void)
{
	enum
	{
		NP = 40, NS = 30
	};
	AmrBitmap  *pmem = malloc(amr_bitmap_size(NP));
	AmrBitmap  *ssd = malloc(amr_bitmap_size(NS));
	AmrStore	s2;
	uint32_t	tier,
				slot;
	int			i,
				taken;

	memset(&s2, 0, sizeof(s2));
	amr_bitmap_init(pmem, NP);
	amr_bitmap_init(ssd, NS);
	s2.pmem_used = pmem;
	s2.pmem_nslots = NP;

	/* no SSD tier: adding takes PMEM slots up to the reserve, then fails */
	for (taken = 0; amr_slot_take(&s2, AMR_SLOT_ADDS, AMR_TIER_PMEM, &tier, &slot) == AMR_OK; taken++)
		CHECK(tier == AMR_TIER_PMEM && slot < NP, "slot %u on tier %u", slot, tier);
	CHECK(taken == NP - AMR_SLOT_RESERVE, "adding took %d of %d slots", taken, NP);
	CHECK(amr_slot_take(&s2, AMR_SLOT_ADDS, AMR_TIER_PMEM, &tier, &slot) == AMR_ERR_PMEM_FULL,
		  "without an SSD tier a full pool is PMEM_FULL");
	CHECK(amr_slot_take(&s2, AMR_SLOT_MIGRATES, AMR_TIER_PMEM, &tier, &slot) != AMR_OK,
		  "a migration took from the reserve");
	/* an SSD-wanting add falls back to PMEM -- which is at its reserve */
	CHECK(amr_slot_take(&s2, AMR_SLOT_ADDS, AMR_TIER_SSD, &tier, &slot) == AMR_ERR_SSD_FULL,
		  "asking for the missing SSD tier is SSD_FULL");
	/* replacing may use the reserve, and only the reserve is left */
	for (i = 0; i < AMR_SLOT_RESERVE; i++)
		CHECK(amr_slot_take(&s2, i % 2 ? AMR_SLOT_REPLACES : AMR_SLOT_REPLACES_HERE,
							AMR_TIER_PMEM, &tier, &slot) == AMR_OK && tier == AMR_TIER_PMEM,
			  "replacing could not use reserve slot %d", i);
	CHECK(amr_slot_take(&s2, AMR_SLOT_REPLACES, AMR_TIER_PMEM, &tier, &slot) == AMR_ERR_PMEM_FULL,
		  "a full pool gave a slot");
	amr_slot_give_back(&s2, AMR_TIER_PMEM, 3);
	CHECK(amr_slot_take(&s2, AMR_SLOT_REPLACES, AMR_TIER_PMEM, &tier, &slot) == AMR_OK && slot == 3,
		  "a slot given back is not taken again");

	/* with an SSD tier: a full PMEM tier falls back, except for these */
	s2.ssd_used = ssd;
	s2.ssd_nslots = NS;
	CHECK(amr_slot_take(&s2, AMR_SLOT_ADDS, AMR_TIER_PMEM, &tier, &slot) == AMR_OK &&
		  tier == AMR_TIER_SSD, "adding did not fall back to SSD");
	CHECK(amr_slot_take(&s2, AMR_SLOT_REPLACES, AMR_TIER_PMEM, &tier, &slot) == AMR_OK &&
		  tier == AMR_TIER_SSD, "replacing did not fall back to SSD");
	CHECK(amr_slot_take(&s2, AMR_SLOT_REPLACES_HERE, AMR_TIER_PMEM, &tier, &slot) == AMR_ERR_PMEM_FULL,
		  "replacing here went to the other tier");
	CHECK(amr_slot_take(&s2, AMR_SLOT_MIGRATES, AMR_TIER_PMEM, &tier, &slot) == AMR_ERR_PMEM_FULL,
		  "a migration to PMEM went to SSD");
	CHECK(amr_slot_take(&s2, AMR_SLOT_MIGRATES, AMR_TIER_SSD, &tier, &slot) == AMR_OK &&
		  tier == AMR_TIER_SSD, "a migration to SSD failed");
	/* both full: SSD_FULL */
	while (amr_slot_take(&s2, AMR_SLOT_REPLACES, AMR_TIER_SSD, &tier, &slot) == AMR_OK)
		;
	CHECK(amr_slot_take(&s2, AMR_SLOT_ADDS, AMR_TIER_PMEM, &tier, &slot) == AMR_ERR_SSD_FULL,
		  "both tiers full is SSD_FULL");
	free(pmem);
	free(ssd);
	return true;
}

/* Budget arithmetic and the tier of new images (core/amr_policy.c). */
static bool
test_budget(void)
{
	CHECK(amr_budget_leaves(AMR_BUDGET_UNLIMITED, 0, 100) == UINT64_MAX, "unlimited");
	CHECK(amr_budget_leaves(AMR_BUDGET_FRACTION, 0.2, 100) == 20, "20%% of 100");
	CHECK(amr_budget_leaves(AMR_BUDGET_FRACTION, 0.2, 99) == 19, "20%% of 99 rounds down");
	/* 0.29 * 100 is 28.999... in float8: the epsilon keeps it 29 */
	CHECK(amr_budget_leaves(AMR_BUDGET_FRACTION, 0.29, 100) == 29, "29%% of 100");
	CHECK(amr_budget_leaves(AMR_BUDGET_FRACTION, 1.0, 7) == 7, "100%%");
	CHECK(amr_budget_leaves(AMR_BUDGET_BYTES, 64.0 * 1024 * 1024, 1) == 16384, "64MB");
	CHECK(amr_budget_leaves(AMR_BUDGET_BYTES, 4095, 1) == 0, "less than a slot");
	CHECK(amr_budget_leaves(AMR_BUDGET_BYTES, 9.2e18, 1) == (uint64_t) (9.2e18 / AMR_SLOT_SIZE),
		  "a budget near 2^63 bytes");
	CHECK(amr_new_image_tier(UINT64_MAX, 1000, 2, true) == AMR_TIER_PMEM, "no budget: PMEM");
	CHECK(amr_new_image_tier(10, 8, 2, true) == AMR_TIER_PMEM, "within budget: PMEM");
	CHECK(amr_new_image_tier(10, 9, 2, true) == AMR_TIER_SSD, "over budget, strict: SSD");
	CHECK(amr_new_image_tier(10, 9, 2, false) == AMR_TIER_PMEM, "over budget, defer: PMEM");
	return true;
}

/* ---- placement planning (core/amr_policy.c) ---- */

/* A candidate as the tier manager's gather would make it. */
static AmrCandidate
cand(uint32_t leaf_id, uint8_t tier, AmrWant want, float hotness)
{
	AmrCandidate c;

	memset(&c, 0, sizeof(c));
	c.leaf_id = leaf_id;
	c.tier = tier;
	c.want = (uint8_t) want;
	c.rule = (uint8_t) (want == AMR_WANT_SSD ? AMR_RULE_R5 :
						want == AMR_WANT_PMEM ? AMR_RULE_R4 : AMR_RULE_NONE);
	c.hotness = hotness;
	return c;
}

/* Whether moves[0..n) are exactly the (leaf, kind) pairs given, in order. */
static bool
moves_are(const AmrMove *moves, size_t n, size_t want_n, const uint32_t *ids,
		  const AmrMoveKind *kinds)
{
	size_t		i;

	if (n != want_n)
		return false;
	for (i = 0; i < n; i++)
		if (moves[i].leaf_id != ids[i] || moves[i].kind != kinds[i])
			return false;
	return true;
}

/* The occupancy that makes R5 demote, and how much. */
static bool
test_rule_excess(void)
{
	CHECK(amr_rule_excess(0, 100, 90, 80) == 0, "an empty pool");
	CHECK(amr_rule_excess(89, 100, 90, 80) == 0, "below the high watermark");
	CHECK(amr_rule_excess(90, 100, 90, 80) == 0, "at the high watermark: not above it");
	CHECK(amr_rule_excess(91, 100, 90, 80) == 11, "just above: down to 80 of 100");
	CHECK(amr_rule_excess(100, 100, 90, 80) == 20, "full: down to 80 of 100");
	CHECK(amr_rule_excess(950, 1003, 90, 80) == 148, "low watermark of 1003 slots rounds down to 802");
	CHECK(amr_rule_excess(95, 100, 90, 95) == 5, "a low watermark above the high one is the high one");
	CHECK(amr_rule_excess(100, 100, 100, 80) == 0, "a high watermark of 100 never demotes");
	CHECK(amr_rule_excess(7, 100, 0, 0) == 7, "0 and 0: every cold leaf, as the paper");
	CHECK(amr_rule_excess(5, 0, 90, 80) == 0, "no PMEM slots");
	CHECK(amr_rule_excess(AMR_MAX_SLOTS, AMR_MAX_SLOTS, 90, 80) ==
		  AMR_MAX_SLOTS - (uint64_t) AMR_MAX_SLOTS * 80 / 100, "the largest pool does not overflow");
	return true;
}

/*
 * Unlimited budget, pool below its high watermark (quota 0): cold leaves
 * stay on PMEM, hot SSD leaves are still promoted.
 */
static bool
test_plan_unlimited_below_watermark(void)
{
	AmrCandidate c[6];
	AmrMove		moves[6];
	size_t		n;
	static const uint32_t ids[] = {6};
	static const AmrMoveKind kinds[] = {AMR_MOVE_PROMOTE};

	c[0] = cand(1, AMR_TIER_PMEM, AMR_WANT_SSD, 0.0f);
	c[1] = cand(2, AMR_TIER_PMEM, AMR_WANT_SSD, 0.2f);
	c[2] = cand(3, AMR_TIER_PMEM, AMR_WANT_STAY, 2.0f);
	c[3] = cand(4, AMR_TIER_PMEM, AMR_WANT_PMEM, 9.0f);
	c[4] = cand(5, AMR_TIER_SSD, AMR_WANT_SSD, 0.1f);
	c[5] = cand(6, AMR_TIER_SSD, AMR_WANT_PMEM, 7.0f);
	n = amr_plan_moves(c, 6, UINT64_MAX, true, 0, moves);
	CHECK(moves_are(moves, n, 1, ids, kinds),
		  "below the watermark: only the promotion of leaf 6 (%zu moves, first leaf %u kind %d)",
		  n, n ? moves[0].leaf_id : 0, n ? (int) moves[0].kind : -1);
	return true;
}

/*
 * Unlimited budget, pool above its high watermark: the coldest R5
 * candidates on PMEM go, coldest first, exactly as many as the quota;
 * promotions go on.
 */
static bool
test_plan_unlimited_above_watermark(void)
{
	AmrCandidate c[8];
	AmrMove		moves[8];
	size_t		n;
	static const uint32_t ids[] = {14, 11, 13, 8};
	static const AmrMoveKind kinds[] = {AMR_MOVE_DEMOTE_RULE, AMR_MOVE_DEMOTE_RULE,
	AMR_MOVE_DEMOTE_RULE, AMR_MOVE_PROMOTE};

	c[0] = cand(10, AMR_TIER_PMEM, AMR_WANT_SSD, 0.4f);
	c[1] = cand(11, AMR_TIER_PMEM, AMR_WANT_SSD, 0.1f);
	c[2] = cand(12, AMR_TIER_PMEM, AMR_WANT_SSD, 0.45f);
	c[3] = cand(13, AMR_TIER_PMEM, AMR_WANT_SSD, 0.3f);
	c[4] = cand(14, AMR_TIER_PMEM, AMR_WANT_SSD, 0.0f);
	/* not R5 candidates: colder than some, but in the band or already on SSD */
	c[5] = cand(15, AMR_TIER_PMEM, AMR_WANT_STAY, 0.05f);
	c[6] = cand(16, AMR_TIER_SSD, AMR_WANT_SSD, 0.0f);
	c[7] = cand(8, AMR_TIER_SSD, AMR_WANT_PMEM, 6.0f);
	n = amr_plan_moves(c, 8, UINT64_MAX, true, 3, moves);
	CHECK(moves_are(moves, n, 4, ids, kinds),
		  "quota 3: demote 14, 11, 13 (coldest first), promote 8 (%zu moves)", n);

	/* a quota beyond the candidates demotes them all, and no more */
	c[0] = cand(10, AMR_TIER_PMEM, AMR_WANT_SSD, 0.4f);
	c[1] = cand(11, AMR_TIER_PMEM, AMR_WANT_SSD, 0.1f);
	c[2] = cand(15, AMR_TIER_PMEM, AMR_WANT_STAY, 0.05f);
	n = amr_plan_moves(c, 3, UINT64_MAX, true, 100, moves);
	CHECK(n == 2 && moves[0].leaf_id == 11 && moves[1].leaf_id == 10 &&
		  moves[0].kind == AMR_MOVE_DEMOTE_RULE && moves[1].kind == AMR_MOVE_DEMOTE_RULE,
		  "quota 100, two candidates: both, coldest first (%zu moves)", n);

	/* without an SSD tier, nothing is demoted whatever the quota */
	c[0] = cand(10, AMR_TIER_PMEM, AMR_WANT_SSD, 0.4f);
	c[1] = cand(11, AMR_TIER_PMEM, AMR_WANT_SSD, 0.1f);
	n = amr_plan_moves(c, 2, UINT64_MAX, false, 5, moves);
	CHECK(n == 0, "no SSD tier: no demotion (%zu moves)", n);
	return true;
}

/*
 * A finite budget is still a fill target: cold leaves below it stay, the
 * coldest go when it is exceeded, promotions fit or displace a leaf at most
 * half as hot; above the high watermark R5 demotes under a budget too.
 */
static bool
test_plan_finite_budget(void)
{
	AmrCandidate c[6];
	AmrMove		moves[8];
	size_t		n;

	/* under the budget, pool below the watermark: cold leaves stay */
	c[0] = cand(1, AMR_TIER_PMEM, AMR_WANT_SSD, 0.0f);
	c[1] = cand(2, AMR_TIER_PMEM, AMR_WANT_SSD, 0.3f);
	c[2] = cand(3, AMR_TIER_PMEM, AMR_WANT_STAY, 2.0f);
	n = amr_plan_moves(c, 3, 10, true, 0, moves);
	CHECK(n == 0, "within a budget of 10: nothing moves (%zu moves)", n);

	/* over the budget: the coldest PMEM leaves, by the budget, not by R5 */
	{
		static const uint32_t ids[] = {1, 3};
		static const AmrMoveKind kinds[] = {AMR_MOVE_DEMOTE_BUDGET, AMR_MOVE_DEMOTE_BUDGET};

		c[0] = cand(4, AMR_TIER_PMEM, AMR_WANT_STAY, 3.0f);
		c[1] = cand(3, AMR_TIER_PMEM, AMR_WANT_STAY, 1.0f);
		c[2] = cand(2, AMR_TIER_PMEM, AMR_WANT_PMEM, 5.0f);
		c[3] = cand(1, AMR_TIER_PMEM, AMR_WANT_SSD, 0.0f);
		n = amr_plan_moves(c, 4, 2, true, 0, moves);
		CHECK(moves_are(moves, n, 2, ids, kinds),
			  "budget 2 of 4: budget demotions of 1 then 3 (%zu moves)", n);
	}

	/* the same above the high watermark: R5 takes the cold one first */
	{
		static const uint32_t ids[] = {1, 3};
		static const AmrMoveKind kinds[] = {AMR_MOVE_DEMOTE_RULE, AMR_MOVE_DEMOTE_BUDGET};

		c[0] = cand(4, AMR_TIER_PMEM, AMR_WANT_STAY, 3.0f);
		c[1] = cand(3, AMR_TIER_PMEM, AMR_WANT_STAY, 1.0f);
		c[2] = cand(2, AMR_TIER_PMEM, AMR_WANT_PMEM, 5.0f);
		c[3] = cand(1, AMR_TIER_PMEM, AMR_WANT_SSD, 0.0f);
		n = amr_plan_moves(c, 4, 2, true, 1, moves);
		CHECK(moves_are(moves, n, 2, ids, kinds),
			  "budget 2 of 4, quota 1: R5 demotes 1, the budget 3 (%zu moves)", n);
	}

	/* within a budget, above the watermark: R5 makes room below the budget */
	c[0] = cand(1, AMR_TIER_PMEM, AMR_WANT_SSD, 0.2f);
	c[1] = cand(2, AMR_TIER_PMEM, AMR_WANT_SSD, 0.0f);
	c[2] = cand(3, AMR_TIER_PMEM, AMR_WANT_STAY, 2.0f);
	n = amr_plan_moves(c, 3, 10, true, 1, moves);
	CHECK(n == 1 && moves[0].leaf_id == 2 && moves[0].kind == AMR_MOVE_DEMOTE_RULE,
		  "budget 10, quota 1: R5 demotes the coldest, leaf 2 (%zu moves)", n);

	/* at the budget, a hot SSD leaf displaces a PMEM leaf at most half as hot */
	{
		static const uint32_t ids[] = {1, 9};
		static const AmrMoveKind kinds[] = {AMR_MOVE_DEMOTE_BUDGET, AMR_MOVE_PROMOTE};

		c[0] = cand(1, AMR_TIER_PMEM, AMR_WANT_STAY, 1.0f);
		c[1] = cand(2, AMR_TIER_PMEM, AMR_WANT_STAY, 3.0f);
		c[2] = cand(9, AMR_TIER_SSD, AMR_WANT_PMEM, 8.0f);
		c[3] = cand(7, AMR_TIER_SSD, AMR_WANT_PMEM, 5.0f);
		n = amr_plan_moves(c, 4, 2, true, 0, moves);
		CHECK(moves_are(moves, n, 2, ids, kinds),
			  "budget 2: 9 (8.0) displaces 1 (1.0); 7 (5.0) cannot displace 2 (3.0) (%zu moves)", n);
	}

	/* room under the budget: promotions, hottest first, until it is full */
	{
		static const uint32_t ids[] = {9, 7};
		static const AmrMoveKind kinds[] = {AMR_MOVE_PROMOTE, AMR_MOVE_PROMOTE};

		c[0] = cand(1, AMR_TIER_PMEM, AMR_WANT_STAY, 5.0f);
		c[1] = cand(7, AMR_TIER_SSD, AMR_WANT_PMEM, 6.0f);
		c[2] = cand(9, AMR_TIER_SSD, AMR_WANT_PMEM, 8.0f);
		c[3] = cand(5, AMR_TIER_SSD, AMR_WANT_PMEM, 4.5f);
		n = amr_plan_moves(c, 4, 3, true, 0, moves);
		CHECK(moves_are(moves, n, 2, ids, kinds),
			  "budget 3 with 1 on PMEM: promote 9, then 7; 5 does not fit (%zu moves)", n);
	}
	return true;
}

/* The pool's R5 demotions shared among trees: the coldest across them all. */
static bool
test_share_rule_quota(void)
{
	AmrCandidate a[4];
	AmrCandidate b[4];
	AmrCandidate *lists[3] = {a, NULL, b};
	size_t		n[3] = {4, 0, 4};
	AmrColdRef	scratch[8];
	uint64_t	quota[3];
	AmrMove		moves[4];
	size_t		nm;

	a[0] = cand(1, AMR_TIER_PMEM, AMR_WANT_SSD, 0.3f);
	a[1] = cand(2, AMR_TIER_PMEM, AMR_WANT_SSD, 0.1f);
	a[2] = cand(3, AMR_TIER_SSD, AMR_WANT_SSD, 0.0f);	/* already on SSD */
	a[3] = cand(4, AMR_TIER_PMEM, AMR_WANT_STAY, 0.05f);	/* R6 or the band */
	b[0] = cand(11, AMR_TIER_PMEM, AMR_WANT_SSD, 0.2f);
	b[1] = cand(12, AMR_TIER_PMEM, AMR_WANT_SSD, 0.0f);
	b[2] = cand(13, AMR_TIER_PMEM, AMR_WANT_SSD, 0.4f);
	b[3] = cand(14, AMR_TIER_PMEM, AMR_WANT_PMEM, 9.0f);

	/* the three coldest: 12 (0.0, b), 2 (0.1, a), 11 (0.2, b) */
	CHECK(amr_share_rule_quota(lists, n, 3, 3, scratch, quota) == 3, "shares 3");
	CHECK(quota[0] == 1 && quota[1] == 0 && quota[2] == 2,
		  "quota a=1 b=2, got %llu %llu %llu", (unsigned long long) quota[0],
		  (unsigned long long) quota[1], (unsigned long long) quota[2]);
	/* and each tree's plan then demotes exactly those */
	nm = amr_plan_moves(a, 4, UINT64_MAX, true, quota[0], moves);
	CHECK(nm == 1 && moves[0].leaf_id == 2, "tree a demotes leaf 2 (%zu moves)", nm);
	nm = amr_plan_moves(b, 4, UINT64_MAX, true, quota[2], moves);
	CHECK(nm == 2 && moves[0].leaf_id == 12 && moves[1].leaf_id == 11,
		  "tree b demotes 12 then 11 (%zu moves)", nm);

	/* more to free than there are candidates: all of them */
	CHECK(amr_share_rule_quota(lists, n, 3, 50, scratch, quota) == 5, "shares all 5");
	CHECK(quota[0] == 2 && quota[2] == 3, "all of a's 2 and b's 3");

	/*
	 * a list left out (tiering off) gets nothing; nothing to free, nothing
	 * shared
	 */
	n[2] = 0;
	CHECK(amr_share_rule_quota(lists, n, 3, 3, scratch, quota) == 2 &&
		  quota[0] == 2 && quota[2] == 0, "only a's candidates");
	CHECK(amr_share_rule_quota(lists, n, 3, 0, scratch, quota) == 0 && quota[0] == 0,
		  "excess 0: no quota");
	return true;
}

int
main(void)
{
	static const TestCase tests[] = {
		{"bitmap", test_bitmap},
		{"float4_rounding_covers", test_rounding},
		{"inner_predicates_are_conservative", test_inner_is_conservative},
		{"overlap_fast_path_is_exact", test_overlap_fast_path},
		{"nan_keys_prune_safely", test_nan_keys_prune_safely},
		{"rstar_split_balanced", test_rstar_split},
		{"leaf_checksum", test_checksum},
		{"ssd_batch_error_names_slot", test_ssd_batch_error_slot},
		{"leaf_mbr_is_union_of_rounded_keys", test_leaf_mbr_is_union},
		{"bulk_pack_and_collect", test_bulk_pack},
		{"point_pack_matches_box_pack", test_point_pack},
		{"insert_split_search_rebuild", test_insert_and_search},
		{"dram_full_is_clean", test_dram_full},
		{"slot_reserve_by_purpose", test_slot_purposes},
		{"budget_arithmetic", test_budget},
		{"rule_excess_watermarks", test_rule_excess},
		{"plan_unlimited_below_watermark", test_plan_unlimited_below_watermark},
		{"plan_unlimited_above_watermark", test_plan_unlimited_above_watermark},
		{"plan_finite_budget", test_plan_finite_budget},
		{"share_rule_quota_coldest_first", test_share_rule_quota},
	};

	return run_tests(tests, sizeof(tests) / sizeof(tests[0]), AMR_PERSIST_CLWB, "amr_core_test");
}
