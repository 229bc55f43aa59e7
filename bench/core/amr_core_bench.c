/*-------------------------------------------------------------------------
 *
 * amr_core_bench.c
 *		Micro-benchmark of the PostgreSQL-free tree core: one-by-one inserts
 *		and range queries, without a server.
 *
 * Reads 2-D boxes from a file written by bench/porto_gen (txt format,
 * "xmin ymin tmin xmax ymax tmax"; the time dimension is ignored), inserts
 * them one by one with amr_insert_single() twice -- once with persistence
 * off ("nop", the paper's in-memory limit) and once with cache-line flushes
 * -- and then runs range queries (&&, box overlap) at four selectivities.
 *
 * The pool (Leaf Table and leaf slots, everything the core persists) is a
 * file in /dev/shm mapped with libpmem's pmem_map_file(), so that the
 * flushes of the persist mode act on a real shared file mapping as they do
 * in the server's emulated-PMEM setup.  The inner nodes, bitmaps and
 * volatile leaf state are plain DRAM, as in the server.
 *
 * Query windows are centred on randomly chosen data boxes.  Two sizings:
 *	- "area" (default): the window has the data extent's aspect ratio and
 *	  sel% of its area.  The measured mean result count is reported.
 *	- "count": a square whose side is calibrated by bisection so that the
 *	  mean result count over a calibration sample equals sel% of the rows.
 * Count sizing cannot reach small targets on Porto-like data: the long
 * trip-joining and GPS-glitch boxes cover every point of the city many
 * times over, so even a point query at a data box returns ~0.3% of the
 * rows (printed as the "point-query floor").  That is why area sizing is
 * the default.  The windows and their result counts are written to
 * <outdir>/windows-<sel>.txt for the Boost.Geometry comparison program,
 * which must reproduce every count.
 *
 * A query reads through the core's own search path: amr_collect_leaves()
 * over the inner nodes, then each candidate leaf's image (found through
 * its Leaf Table word) is scanned with amr_leaf_match(), as amr_scan.c
 * does.  A sample of windows per selectivity is checked against a
 * brute-force count over all rows; any difference exits with status 1.
 *
 * Machine-readable results are printed on lines starting with '@'.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpmem.h>

#include "amr_persist.h"
#include "amr_tree.h"

#define NSELS 4

/* Selectivities in percent of the data set, and their file name labels. */
static const double sel_pct[NSELS] = {0.001, 0.01, 0.1, 1.0};
static const char *const sel_label[NSELS] = {"0.001", "0.01", "0.1", "1"};

typedef struct Options
{
	const char *data_path;
	const char *outdir;
	const char *pool_dir;		/* NULL: anonymous aligned memory */
	size_t		rows;
	int			windows;
	int			verify;
	int			calib;
	bool		size_by_count;	/* else by area */
	uint64_t	seed;
	AmrPersistMode persist;
} Options;

/* A store plus the memory behind it, so that it can be torn down. */
typedef struct Bench
{
	AmrStore	st;
	AmrTree    *t;
	char	   *pool;			/* Leaf Table + tree records + slots */
	size_t		pool_len;
	bool		pool_mapped;	/* from pmem_map_file (else aligned_alloc) */
	int			pool_is_pmem;
} Bench;

/* ---- small helpers ---- */

/* deterministic PRNG (splitmix64), the same as the unit tests use */
static uint64_t
rng_next(uint64_t *state)
{
	uint64_t	z = (*state += UINT64_C(0x9E3779B97F4A7C15));

	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *
bench_realloc(void *p, size_t size, void *arg)
{
	void	   *r;

	(void) arg;
	r = realloc(p, size);
	if (r == NULL)
	{
		fprintf(stderr, "out of memory\n");
		exit(2);
	}
	return r;
}

static void *
xmalloc(size_t size)
{
	void	   *p = malloc(size);

	if (p == NULL)
	{
		fprintf(stderr, "out of memory (%zu bytes)\n", size);
		exit(2);
	}
	return p;
}

/*
 * DRAM that is touched before it is used, so that first-touch page faults
 * are not charged to the timed inserts: the server allocates its shared
 * memory at startup, too.
 */
static void *
xcalloc_touched(size_t size)
{
	void	   *p = xmalloc(size);

	memset(p, 0, size);
	return p;
}

static const char *
status_name(AmrStatus s)
{
	switch (s)
	{
		case AMR_OK:
			return "ok";
		case AMR_ERR_DRAM_FULL:
			return "inner node arena full";
		case AMR_ERR_PMEM_FULL:
			return "no free PMEM slot";
		case AMR_ERR_SSD_FULL:
			return "no free SSD slot";
		case AMR_ERR_LEAF_IDS_FULL:
			return "Leaf Table full";
		case AMR_ERR_TOO_TALL:
			return "tree too tall";
	}
	return "unknown";
}

/* ---- data ---- */

/*
 * Read up to maxrows boxes.  strtod() is used (rather than a hand-rolled
 * parser) so that the C++ comparison program, which also uses strtod(),
 * gets bit-identical coordinates.
 */
static AmrBox *
read_boxes(const char *path, size_t maxrows, size_t *nout)
{
	FILE	   *f = fopen(path, "r");
	AmrBox	   *boxes;
	size_t		n = 0;
	char		line[512];

	if (f == NULL)
	{
		fprintf(stderr, "cannot open \"%s\": %s\n", path, strerror(errno));
		exit(2);
	}
	boxes = xmalloc(sizeof(AmrBox) * maxrows);
	while (n < maxrows && fgets(line, sizeof(line), f) != NULL)
	{
		char	   *p = line,
				   *end;
		double		v[6];
		int			i;

		for (i = 0; i < 6; i++)
		{
			v[i] = strtod(p, &end);
			if (end == p)
				break;
			p = end;
		}
		if (i < 6)
		{
			fprintf(stderr, "%s:%zu: expected \"xmin ymin tmin xmax ymax tmax\"\n",
					path, n + 1);
			exit(2);
		}
		boxes[n].xlo = v[0];
		boxes[n].ylo = v[1];
		boxes[n].xhi = v[3];
		boxes[n].yhi = v[4];
		n++;
	}
	fclose(f);
	*nout = n;
	return boxes;
}

static AmrLeafEntry
make_entry(const AmrBox *b, uint32_t id)
{
	AmrLeafEntry e;

	memset(&e, 0, sizeof(e));
	e.key = *b;
	/* the row number travels in the TID fields, as in the unit tests */
	e.tid_blk_hi = (uint16_t) (id >> 16);
	e.tid_blk_lo = (uint16_t) (id & 0xFFFF);
	e.tid_off = 1;
	e.insert_lsn = (uint64_t) id + 1;
	return e;
}

/* ---- the store ---- */

/*
 * Size a store for nrows entries.  A leaf holds AMR_LEAF_CAPACITY (84)
 * entries and the R* split keeps at least 40% in each half, so leaves are
 * at least ~34 entries full; nrows/25 slots leave ample headroom.
 */
static void
bench_init(Bench *b, const Options *o, size_t nrows)
{
	uint32_t	nslots = (uint32_t) (nrows / 25 + 1024);
	uint32_t	nnodes = nslots / 8 + 64;
	size_t		lt_bytes = sizeof(AmrLeafTableEntry) * nslots;
	size_t		tr_bytes = sizeof(AmrTreeRecord) * AMR_MAX_TREES;
	size_t		lt_off = 0;
	size_t		tr_off = (lt_off + lt_bytes + AMR_SLOT_SIZE - 1) & ~(size_t) (AMR_SLOT_SIZE - 1);
	size_t		slots_off = (tr_off + tr_bytes + AMR_SLOT_SIZE - 1) & ~(size_t) (AMR_SLOT_SIZE - 1);
	AmrStore   *s = &b->st;

	memset(b, 0, sizeof(*b));
	b->pool_len = slots_off + (size_t) nslots * AMR_SLOT_SIZE;
	if (o->pool_dir != NULL)
	{
		char		path[1024];
		size_t		mapped;

		snprintf(path, sizeof(path), "%s/amr_core_bench.%d.pool", o->pool_dir, (int) getpid());
		b->pool = pmem_map_file(path, b->pool_len, PMEM_FILE_CREATE | PMEM_FILE_EXCL,
								0600, &mapped, &b->pool_is_pmem);
		if (b->pool == NULL)
		{
			fprintf(stderr, "pmem_map_file(\"%s\", %zu): %s\n", path, b->pool_len,
					pmem_errormsg());
			exit(2);
		}
		/* the mapping keeps the pages; unlinking now means no leftovers */
		unlink(path);
		b->pool_len = mapped;
		b->pool_mapped = true;
	}
	else
	{
		b->pool = aligned_alloc(AMR_SLOT_SIZE, b->pool_len);
		if (b->pool == NULL)
		{
			fprintf(stderr, "out of memory (%zu bytes)\n", b->pool_len);
			exit(2);
		}
	}
	/* pre-fault the whole pool (and zero it: a free Leaf Table is zero) */
	memset(b->pool, 0, b->pool_len);

	s->pool_base = b->pool;
	s->header = NULL;			/* the core never reads the pool header */
	s->lt = (AmrLeafTableEntry *) (b->pool + lt_off);
	s->lt_capacity = nslots;
	s->tree_records = (AmrTreeRecord *) (b->pool + tr_off);
	s->pmem_slots = b->pool + slots_off;
	s->pmem_nslots = nslots;
	s->pmem_used = xcalloc_touched(amr_bitmap_size(nslots));
	amr_bitmap_init(s->pmem_used, nslots);
	s->leaf_ids_used = xcalloc_touched(amr_bitmap_size(nslots));
	amr_bitmap_init(s->leaf_ids_used, nslots);
	s->ssd_used = NULL;
	s->ssd_nslots = 0;
	s->nodes_used = xcalloc_touched(amr_bitmap_size(nnodes));
	amr_bitmap_init(s->nodes_used, nnodes);
	s->nodes = xcalloc_touched(sizeof(AmrInnerNode) * nnodes);
	s->nnodes = nnodes;
	s->leaves = xcalloc_touched(sizeof(AmrLeafVolatile) * nslots);
	s->trees = xcalloc_touched(sizeof(AmrTree) * AMR_MAX_TREES);

	b->t = &s->trees[1];
	b->t->tree_no = 1;
	b->t->generation = 1;
	b->t->root = b->t->null_root = AMR_INVALID_NODE;
	if (amr_tree_init_empty(s, b->t) != AMR_OK)
	{
		fprintf(stderr, "amr_tree_init_empty failed\n");
		exit(2);
	}
}

static void
bench_free(Bench *b)
{
	AmrStore   *s = &b->st;

	if (b->pool_mapped)
		pmem_unmap(b->pool, b->pool_len);
	else
		free(b->pool);
	free(s->pmem_used);
	free(s->leaf_ids_used);
	free(s->nodes_used);
	free(s->nodes);
	free(s->leaves);
	free(s->trees);
	memset(b, 0, sizeof(*b));
}

/* Insert every entry; returns the elapsed milliseconds. */
static double
insert_all(Bench *b, const AmrLeafEntry *entries, size_t n)
{
	double		start = now_ms(),
				elapsed;
	size_t		i;
	char		msg[512];
	uint8_t    *seen;
	const char *problem;

	for (i = 0; i < n; i++)
	{
		AmrStatus	rc = amr_insert_single(&b->st, b->t, &entries[i]);

		if (rc != AMR_OK)
		{
			fprintf(stderr, "insert %zu failed: %s\n", i, status_name(rc));
			exit(2);
		}
	}
	elapsed = now_ms() - start;

	/* not timed: the tree must be well formed and hold every entry */
	seen = xmalloc(b->st.lt_capacity);
	problem = amr_check_tree(&b->st, b->t, seen, msg, sizeof(msg));
	free(seen);
	if (problem != NULL)
	{
		fprintf(stderr, "FAIL: amr_check_tree: %s\n", problem);
		exit(1);
	}
	if (b->t->nentries != n)
	{
		fprintf(stderr, "FAIL: tree counts %" PRIu64 " entries, inserted %zu\n",
				b->t->nentries, n);
		exit(1);
	}
	return elapsed;
}

/* ---- queries ---- */

/*
 * Count the entries overlapping q (PostgreSQL's box && box, EPSILON fuzz
 * included) through the core's search path.  "list" is reused across
 * queries so that its growth is not charged to every query; a scan in the
 * server keeps its candidate array for the scan's lifetime in the same way.
 */
static uint64_t
amr_query_count(const Bench *b, const AmrBox *q, AmrLeafList *list)
{
	AmrScanKey	k;
	uint64_t	count = 0;
	uint32_t	i;

	k.strategy = AMR_STRAT_OVERLAP;
	k.prune = true;
	k.query = *q;
	list->n = 0;
	amr_collect_leaves(&b->st, b->t, false, &k, 1, list, NULL, NULL, bench_realloc, NULL);
	for (i = 0; i < list->n; i++)
	{
		uint64_t	w = amr_lt_word(&b->st, list->ids[i]);
		const AmrLeaf *leaf = amr_pmem_slot(&b->st, AMR_WORD_SLOT(w));
		uint64_t	n = leaf->hdr.nentries;
		uint64_t	j;

		for (j = 0; j < n; j++)
		{
			const AmrLeafEntry *e = &leaf->entries[j];

			if (e->flags & (AMR_ENTRY_FLAG_NULL | AMR_ENTRY_FLAG_DEAD))
				continue;
			if (amr_leaf_match(AMR_STRAT_OVERLAP, &e->key, q))
				count++;
		}
	}
	return count;
}

static uint64_t
brute_count(const AmrBox *rows, size_t n, const AmrBox *q)
{
	uint64_t	count = 0;
	size_t		i;

	for (i = 0; i < n; i++)
		if (amr_leaf_match(AMR_STRAT_OVERLAP, &rows[i], q))
			count++;
	return count;
}

static AmrBox
window_at(const AmrBox *centre_box, double wx, double wy)
{
	double		cx = (centre_box->xlo + centre_box->xhi) * 0.5;
	double		cy = (centre_box->ylo + centre_box->yhi) * 0.5;
	AmrBox		q;

	q.xlo = cx - wx * 0.5;
	q.xhi = cx + wx * 0.5;
	q.ylo = cy - wy * 0.5;
	q.yhi = cy + wy * 0.5;
	return q;
}

static double
mean_count(const Bench *b, const AmrBox *rows, const size_t *centres, int nc,
		   double side, AmrLeafList *list)
{
	uint64_t	total = 0;
	int			i;

	for (i = 0; i < nc; i++)
	{
		AmrBox		q = window_at(&rows[centres[i]], side, side);

		total += amr_query_count(b, &q, list);
	}
	return (double) total / nc;
}

/*
 * Window side whose mean result count over a fixed sample of centres is
 * closest to target.  The mean is monotone in the side, so bisection (on a
 * log scale, the sides span many orders of magnitude) converges.
 */
static double
calibrate_side(const Bench *b, const AmrBox *rows, double target,
			   double extent, const size_t *centres, int ncentres,
			   AmrLeafList *list)
{
	double		lo = log(extent * 1e-8),
				hi = log(extent * 2.0);
	int			i;

	for (i = 0; i < 40 && hi - lo > 1e-3; i++)
	{
		double		mid = 0.5 * (lo + hi);

		if (mean_count(b, rows, centres, ncentres, exp(mid), list) < target)
			lo = mid;
		else
			hi = mid;
	}
	return exp(0.5 * (lo + hi));
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: amr_core_bench --data FILE [--rows N] [--windows Q] [--verify V]\n"
			"                      [--size-by area|count] [--calib C] [--outdir DIR]\n"
			"                      [--pool-dir DIR|--pool-anon]\n"
			"                      [--persist clwb|clflush] [--seed S]\n"
			"  --data FILE    boxes from bench/porto_gen (txt format)\n"
			"  --rows N       rows to insert (default 1000000, or fewer if the file is shorter)\n"
			"  --windows Q    query windows per selectivity (default 2000)\n"
			"  --verify V     windows per selectivity checked by brute force (default 20)\n"
			"  --size-by M    area: window covers sel%% of the data extent's area\n"
			"                 (default); count: square calibrated to return sel%% of\n"
			"                 the rows on average\n"
			"  --calib C      windows used to calibrate (default 200)\n"
			"  --outdir DIR   where windows-<sel>.txt are written (default .)\n"
			"  --pool-dir DIR directory of the mapped pool file (default /dev/shm)\n"
			"  --pool-anon    pool in plain aligned memory instead of a mapped file\n"
			"  --persist M    flush mode of the persist run: clwb (default; falls back\n"
			"                 to clflushopt/clflush if the CPU lacks it) or clflush\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	Options		o;
	AmrBox	   *rows;
	AmrLeafEntry *entries;
	size_t		nrows,
				i;
	Bench		b;
	double		ms_nop,
				ms_persist;
	const char *persist_desc;
	AmrFBox		ext = amr_fbox_empty();
	double		extent;
	AmrLeafList list = {NULL, 0, 0};
	size_t	   *centres;
	double		floor_mean;
	int			s;
	int			failures = 0;

	memset(&o, 0, sizeof(o));
	o.outdir = ".";
	o.pool_dir = "/dev/shm";
	o.rows = 1000000;
	o.windows = 2000;
	o.verify = 20;
	o.calib = 200;
	o.seed = 1;
	o.persist = AMR_PERSIST_CLWB;
	for (i = 1; i < (size_t) argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < (size_t) argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--pool-anon") == 0)
		{
			o.pool_dir = NULL;
			continue;
		}
		if (v == NULL)
			usage();
		if (strcmp(a, "--data") == 0)
			o.data_path = v;
		else if (strcmp(a, "--rows") == 0)
			o.rows = strtoull(v, NULL, 10);
		else if (strcmp(a, "--windows") == 0)
			o.windows = atoi(v);
		else if (strcmp(a, "--verify") == 0)
			o.verify = atoi(v);
		else if (strcmp(a, "--calib") == 0)
			o.calib = atoi(v);
		else if (strcmp(a, "--size-by") == 0)
		{
			if (strcmp(v, "area") == 0)
				o.size_by_count = false;
			else if (strcmp(v, "count") == 0)
				o.size_by_count = true;
			else
				usage();
		}
		else if (strcmp(a, "--outdir") == 0)
			o.outdir = v;
		else if (strcmp(a, "--pool-dir") == 0)
			o.pool_dir = v;
		else if (strcmp(a, "--seed") == 0)
			o.seed = strtoull(v, NULL, 10);
		else if (strcmp(a, "--persist") == 0)
		{
			if (strcmp(v, "clwb") == 0)
				o.persist = AMR_PERSIST_CLWB;
			else if (strcmp(v, "clflush") == 0)
				o.persist = AMR_PERSIST_CLFLUSH;
			else
				usage();
		}
		else
			usage();
		i++;
	}
	if (o.data_path == NULL || o.rows == 0 || o.windows <= 0 || o.calib <= 0 ||
		o.verify < 0 || o.rows > UINT32_MAX)
		usage();
	if (o.verify > o.windows)
		o.verify = o.windows;

	rows = read_boxes(o.data_path, o.rows, &nrows);
	if (nrows == 0)
	{
		fprintf(stderr, "no rows in \"%s\"\n", o.data_path);
		return 2;
	}
	entries = xmalloc(sizeof(AmrLeafEntry) * nrows);
	for (i = 0; i < nrows; i++)
	{
		AmrFBox		f = amr_fbox_from_box(&rows[i]);

		entries[i] = make_entry(&rows[i], (uint32_t) i);
		amr_fbox_extend(&ext, &f);
	}
	extent = fmax(ext.xhi - ext.xlo, ext.yhi - ext.ylo);

	printf("amr_core_bench: %zu rows from %s, extent x [%g, %g] y [%g, %g]\n",
		   nrows, o.data_path, ext.xlo, ext.xhi, ext.ylo, ext.yhi);
	printf("leaf capacity %zu entries, inner fan-out %d\n",
		   (size_t) AMR_LEAF_CAPACITY, AMR_INNER_FANOUT);

	/* 1. inserts with persistence off: the in-memory limit */
	amr_persist_init(AMR_PERSIST_NOP);
	bench_init(&b, &o, nrows);
	printf("pool: %s, %zu MB, pre-faulted%s\n",
		   b.pool_mapped ? "file in /dev/shm mapped with pmem_map_file" :
		   "plain aligned memory (no file mapping)",
		   b.pool_len >> 20,
		   b.pool_mapped ? (b.pool_is_pmem ? ", is_pmem=1" : ", is_pmem=0 (tmpfs)") : "");
	ms_nop = insert_all(&b, entries, nrows);
	printf("@insert mode=nop flush=\"%s\" n=%zu ms=%.1f per_ms=%.1f\n",
		   amr_persist_describe(), nrows, ms_nop, nrows / ms_nop);
	bench_free(&b);

	/* 2. inserts with every persist flushed and fenced */
	amr_persist_init(o.persist);
	persist_desc = amr_persist_describe();
	bench_init(&b, &o, nrows);
	ms_persist = insert_all(&b, entries, nrows);
	printf("@insert mode=persist flush=\"%s\" pool=%s n=%zu ms=%.1f per_ms=%.1f\n",
		   persist_desc, b.pool_mapped ? "shm_file" : "anon", nrows, ms_persist,
		   nrows / ms_persist);
	printf("tree: height %u, %" PRIu64 " leaves (%.1f entries/leaf), %" PRIu64 " inner nodes\n",
		   b.t->height, b.t->nleaves, (double) nrows / (double) b.t->nleaves, b.t->ninner);

	/*
	 * 3. range queries on the tree just built (queries never flush).  First
	 * the point-query floor: the mean result count of a zero-size window at a
	 * data box, below which no sizing can go.
	 */
	centres = xmalloc(sizeof(size_t) * o.calib);
	{
		uint64_t	rng = o.seed * 1000 + 1;

		for (i = 0; i < (size_t) o.calib; i++)
			centres[i] = rng_next(&rng) % nrows;
	}
	floor_mean = mean_count(&b, rows, centres, o.calib, 0.0, &list);
	printf("point-query floor: a zero-size window at a data box returns %.1f rows "
		   "on average (%.4f%% of the rows)\n",
		   floor_mean, 100.0 * floor_mean / (double) nrows);
	printf("@floor mean_results=%.1f pct=%.5f\n", floor_mean,
		   100.0 * floor_mean / (double) nrows);

	for (s = 0; s < NSELS; s++)
	{
		double		frac = sel_pct[s] / 100.0;
		double		target = frac * (double) nrows;
		double		wx,
					wy;
		AmrBox	   *win = xmalloc(sizeof(AmrBox) * o.windows);
		uint64_t   *cnt = xmalloc(sizeof(uint64_t) * o.windows);
		uint64_t	rng = o.seed * 7919 + (uint64_t) s + 17;
		uint64_t	total = 0,
					total2 = 0;
		double		start,
					elapsed;
		int			q;
		char		path[1024];
		FILE	   *f;

		if (o.size_by_count)
		{
			if (target < floor_mean)
				printf("warning: sel %s%% (%.1f rows) is below the point-query floor; "
					   "windows degenerate to points\n", sel_label[s], target);
			wx = wy = calibrate_side(&b, rows, target, extent, centres, o.calib,
									 &list);
		}
		else
		{
			wx = (ext.xhi - ext.xlo) * sqrt(frac);
			wy = (ext.yhi - ext.ylo) * sqrt(frac);
		}
		for (q = 0; q < o.windows; q++)
			win[q] = window_at(&rows[rng_next(&rng) % nrows], wx, wy);

		/* warm-up pass, which also records the counts */
		for (q = 0; q < o.windows; q++)
		{
			cnt[q] = amr_query_count(&b, &win[q], &list);
			total += cnt[q];
		}
		start = now_ms();
		for (q = 0; q < o.windows; q++)
			total2 += amr_query_count(&b, &win[q], &list);
		elapsed = now_ms() - start;
		if (total2 != total)
		{
			fprintf(stderr, "FAIL: repeated queries gave %" PRIu64 " then %" PRIu64 " results\n",
					total, total2);
			return 1;
		}

		/* correctness: the index must find exactly what a full scan finds */
		for (q = 0; q < o.verify; q++)
		{
			uint64_t	expect = brute_count(rows, nrows, &win[q]);

			if (expect != cnt[q])
			{
				fprintf(stderr, "FAIL: sel %s%% window %d (%.17g,%.17g,%.17g,%.17g): "
						"index %" PRIu64 " rows, brute force %" PRIu64 "\n",
						sel_label[s], q, win[q].xlo, win[q].ylo, win[q].xhi, win[q].yhi,
						cnt[q], expect);
				failures++;
			}
		}

		snprintf(path, sizeof(path), "%s/windows-%s.txt", o.outdir, sel_label[s]);
		if ((f = fopen(path, "w")) == NULL)
		{
			fprintf(stderr, "cannot write \"%s\": %s\n", path, strerror(errno));
			return 2;
		}
		/* %.17g round-trips doubles exactly through strtod */
		for (q = 0; q < o.windows; q++)
			fprintf(f, "%.17g %.17g %.17g %.17g %" PRIu64 "\n",
					win[q].xlo, win[q].ylo, win[q].xhi, win[q].yhi, cnt[q]);
		if (fclose(f) != 0)
		{
			fprintf(stderr, "cannot write \"%s\": %s\n", path, strerror(errno));
			return 2;
		}

		printf("@query sel=%s sizing=%s wx=%.6g wy=%.6g windows=%d mean_us=%.3f "
			   "mean_results=%.1f measured_sel_pct=%.5f verified=%d\n",
			   sel_label[s], o.size_by_count ? "count" : "area", wx, wy,
			   o.windows, elapsed * 1000.0 / o.windows,
			   (double) total / o.windows, 100.0 * total / o.windows / (double) nrows,
			   o.verify);
		free(win);
		free(cnt);
	}
	fflush(stdout);

	free(list.ids);
	free(centres);
	bench_free(&b);
	free(entries);
	free(rows);
	if (failures > 0)
	{
		fprintf(stderr, "FAIL: %d windows differ from brute force\n", failures);
		return 1;
	}
	printf("brute-force check: %d windows per selectivity agree\n", o.verify);
	return 0;
}
