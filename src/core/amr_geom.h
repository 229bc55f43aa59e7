/*-------------------------------------------------------------------------
 *
 * amr_geom.h
 *		Boxes, the twelve box_ops strategies, and the geometry the tree
 *		algorithms need (union, area, margin, enlargement).
 *
 * This file is free of PostgreSQL headers so that the tree core can be
 * unit-tested and micro-benchmarked without a server.  The leaf predicates
 * reproduce PostgreSQL 15's box operators (utils/adt/geo_ops.c) exactly,
 * including the EPSILON fuzz of utils/geo_decls.h, so that an index scan
 * returns the same rows as a sequential scan.  Inner-node predicates are the
 * "could any box inside this MBR satisfy the leaf predicate" relaxation; they
 * are monotone in the MBR, which is what makes the outward-rounded float4
 * MBRs of inner nodes safe (a larger MBR can only admit more subtrees).
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_GEOM_H
#define AMR_GEOM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* Same value as EPSILON in PostgreSQL's utils/geo_decls.h */
#define AMR_EPSILON 1.0E-06

/* Strategy numbers: identical to access/stratnum.h and GiST's box_ops */
#define AMR_STRAT_LEFT			1	/* << */
#define AMR_STRAT_OVERLEFT		2	/* &< */
#define AMR_STRAT_OVERLAP		3	/* && */
#define AMR_STRAT_OVERRIGHT		4	/* &> */
#define AMR_STRAT_RIGHT			5	/* >> */
#define AMR_STRAT_SAME			6	/* ~= */
#define AMR_STRAT_CONTAINS		7	/* @> */
#define AMR_STRAT_CONTAINED_BY	8	/* <@ */
#define AMR_STRAT_OVERBELOW		9	/* &<| */
#define AMR_STRAT_BELOW			10	/* <<| */
#define AMR_STRAT_ABOVE			11	/* |>> */
#define AMR_STRAT_OVERABOVE		12	/* |&> */
#define AMR_STRAT_DISTANCE		15	/* <-> (reserved for KNN) */
#define AMR_NUM_STRATEGIES		12

/* An exact key: float8, as stored in leaves. */
typedef struct AmrBox
{
	double		xlo;
	double		ylo;
	double		xhi;
	double		yhi;
} AmrBox;

/*
 * A bounding box in float4, rounded outward from the float8 boxes it covers.
 * Used by inner nodes and the Leaf Table; never used to decide whether a row
 * matches, only whether a subtree may contain one.
 */
typedef struct AmrFBox
{
	float		xlo;
	float		ylo;
	float		xhi;
	float		yhi;
} AmrFBox;

/* PostgreSQL's fuzzy comparisons (geo_decls.h), reproduced exactly. */
static inline bool
amr_fp_eq(double a, double b)
{
	return a == b || fabs(a - b) <= AMR_EPSILON;
}

static inline bool
amr_fp_lt(double a, double b)
{
	return a + AMR_EPSILON < b;
}

static inline bool
amr_fp_le(double a, double b)
{
	return a <= b + AMR_EPSILON;
}

static inline bool
amr_fp_gt(double a, double b)
{
	return a > b + AMR_EPSILON;
}

static inline bool
amr_fp_ge(double a, double b)
{
	return a + AMR_EPSILON >= b;
}

static inline bool
amr_box_has_nan(const AmrBox *b)
{
	return isnan(b->xlo) || isnan(b->ylo) || isnan(b->xhi) || isnan(b->yhi);
}

/*
 * Leaf predicate: does key <op> query hold?  Mirrors box_left, box_overleft,
 * box_overlap, ... of geo_ops.c for boxes without NaN coordinates.  Callers
 * evaluate queries that contain NaN with PostgreSQL's own operator instead.
 */
static inline bool
amr_leaf_match(int strategy, const AmrBox *k, const AmrBox *q)
{
	switch (strategy)
	{
		case AMR_STRAT_LEFT:
			return amr_fp_lt(k->xhi, q->xlo);
		case AMR_STRAT_OVERLEFT:
			return amr_fp_le(k->xhi, q->xhi);
		case AMR_STRAT_OVERLAP:
			return amr_fp_le(k->xlo, q->xhi) && amr_fp_le(q->xlo, k->xhi) &&
				amr_fp_le(k->ylo, q->yhi) && amr_fp_le(q->ylo, k->yhi);
		case AMR_STRAT_OVERRIGHT:
			return amr_fp_ge(k->xlo, q->xlo);
		case AMR_STRAT_RIGHT:
			return amr_fp_gt(k->xlo, q->xhi);
		case AMR_STRAT_SAME:
			return amr_fp_eq(k->xhi, q->xhi) && amr_fp_eq(k->xlo, q->xlo) &&
				amr_fp_eq(k->yhi, q->yhi) && amr_fp_eq(k->ylo, q->ylo);
		case AMR_STRAT_CONTAINS:
			return amr_fp_ge(k->xhi, q->xhi) && amr_fp_le(k->xlo, q->xlo) &&
				amr_fp_ge(k->yhi, q->yhi) && amr_fp_le(k->ylo, q->ylo);
		case AMR_STRAT_CONTAINED_BY:
			return amr_fp_ge(q->xhi, k->xhi) && amr_fp_le(q->xlo, k->xlo) &&
				amr_fp_ge(q->yhi, k->yhi) && amr_fp_le(q->ylo, k->ylo);
		case AMR_STRAT_OVERBELOW:
			return amr_fp_le(k->yhi, q->yhi);
		case AMR_STRAT_BELOW:
			return amr_fp_lt(k->yhi, q->ylo);
		case AMR_STRAT_ABOVE:
			return amr_fp_gt(k->ylo, q->yhi);
		case AMR_STRAT_OVERABOVE:
			return amr_fp_ge(k->ylo, q->ylo);
	}
	return false;
}

/*
 * Inner predicate: may some box inside the bounding box m satisfy
 * "box <op> q"?  Each case takes the most favourable box inside m (a corner
 * or m itself), so the test is exact for that relaxation and monotone in m.
 */
static inline bool
amr_inner_match(int strategy, const AmrFBox *m, const AmrBox *q)
{
	switch (strategy)
	{
		case AMR_STRAT_LEFT:
			return amr_fp_lt(m->xlo, q->xlo);
		case AMR_STRAT_OVERLEFT:
			return amr_fp_le(m->xlo, q->xhi);
		case AMR_STRAT_OVERLAP:
		case AMR_STRAT_CONTAINED_BY:
			return amr_fp_le(m->xlo, q->xhi) && amr_fp_le(q->xlo, m->xhi) &&
				amr_fp_le(m->ylo, q->yhi) && amr_fp_le(q->ylo, m->yhi);
		case AMR_STRAT_OVERRIGHT:
			return amr_fp_ge(m->xhi, q->xlo);
		case AMR_STRAT_RIGHT:
			return amr_fp_gt(m->xhi, q->xhi);
		case AMR_STRAT_SAME:
		case AMR_STRAT_CONTAINS:
			return amr_fp_ge(m->xhi, q->xhi) && amr_fp_le(m->xlo, q->xlo) &&
				amr_fp_ge(m->yhi, q->yhi) && amr_fp_le(m->ylo, q->ylo);
		case AMR_STRAT_OVERBELOW:
			return amr_fp_le(m->ylo, q->yhi);
		case AMR_STRAT_BELOW:
			return amr_fp_lt(m->ylo, q->ylo);
		case AMR_STRAT_ABOVE:
			return amr_fp_gt(m->yhi, q->yhi);
		case AMR_STRAT_OVERABOVE:
			return amr_fp_ge(m->yhi, q->ylo);
	}
	/* unknown strategy: never prune */
	return true;
}

/* Round a float8 down / up to the nearest float4 that does not cut the box. */
static inline float
amr_round_down(double v)
{
	float		f = (float) v;

	if ((double) f > v)
		f = nextafterf(f, -INFINITY);
	return f;
}

static inline float
amr_round_up(double v)
{
	float		f = (float) v;

	if ((double) f < v)
		f = nextafterf(f, INFINITY);
	return f;
}

/*
 * The float4 bounding box of a key, rounded outward.  A NaN coordinate
 * becomes the infinity on its side (a low edge -inf, a high edge +inf), so
 * no NaN ever reaches an inner node.  That is a valid bound for pruning:
 * every box operator is a conjunction of comparisons that are false when a
 * NaN takes part, so whether it holds for a key with NaN depends only on
 * the key's other coordinates, and a box with those coordinates lies inside
 * the widened one.  (Leaves still evaluate such keys with PostgreSQL's own
 * operator: see AMR_ENTRY_FLAG_NAN.)
 */
static inline AmrFBox
amr_fbox_from_box(const AmrBox *b)
{
	AmrFBox		r;

	r.xlo = isnan(b->xlo) ? -INFINITY : amr_round_down(b->xlo);
	r.ylo = isnan(b->ylo) ? -INFINITY : amr_round_down(b->ylo);
	r.xhi = isnan(b->xhi) ? INFINITY : amr_round_up(b->xhi);
	r.yhi = isnan(b->yhi) ? INFINITY : amr_round_up(b->yhi);
	return r;
}

/* An "empty" bounding box: the identity of union. */
static inline AmrFBox
amr_fbox_empty(void)
{
	AmrFBox		r = {INFINITY, INFINITY, -INFINITY, -INFINITY};

	return r;
}

static inline bool
amr_fbox_is_empty(const AmrFBox *b)
{
	return b->xlo > b->xhi || b->ylo > b->yhi;
}

static inline void
amr_fbox_extend(AmrFBox *acc, const AmrFBox *b)
{
	if (b->xlo < acc->xlo)
		acc->xlo = b->xlo;
	if (b->ylo < acc->ylo)
		acc->ylo = b->ylo;
	if (b->xhi > acc->xhi)
		acc->xhi = b->xhi;
	if (b->yhi > acc->yhi)
		acc->yhi = b->yhi;
}

static inline bool
amr_fbox_covers(const AmrFBox *outer, const AmrFBox *inner)
{
	return outer->xlo <= inner->xlo && outer->ylo <= inner->ylo &&
		outer->xhi >= inner->xhi && outer->yhi >= inner->yhi;
}

/*
 * Geometry for choosing subtrees and splitting.  Coordinates are clamped so
 * that infinite boxes give finite (huge) areas instead of inf - inf = NaN;
 * this only steers heuristics, never correctness.
 */
#define AMR_GEOM_CLAMP 1.0e30

static inline double
amr_clamp(double v)
{
	if (v > AMR_GEOM_CLAMP)
		return AMR_GEOM_CLAMP;
	if (v < -AMR_GEOM_CLAMP)
		return -AMR_GEOM_CLAMP;
	return v;
}

static inline double
amr_fbox_area(const AmrFBox *b)
{
	if (amr_fbox_is_empty(b))
		return 0.0;
	return (amr_clamp(b->xhi) - amr_clamp(b->xlo)) *
		(amr_clamp(b->yhi) - amr_clamp(b->ylo));
}

static inline double
amr_fbox_margin(const AmrFBox *b)
{
	if (amr_fbox_is_empty(b))
		return 0.0;
	return (amr_clamp(b->xhi) - amr_clamp(b->xlo)) +
		(amr_clamp(b->yhi) - amr_clamp(b->ylo));
}

static inline double
amr_fbox_overlap_area(const AmrFBox *a, const AmrFBox *b)
{
	double		w = fmin(amr_clamp(a->xhi), amr_clamp(b->xhi)) -
		fmax(amr_clamp(a->xlo), amr_clamp(b->xlo));
	double		h = fmin(amr_clamp(a->yhi), amr_clamp(b->yhi)) -
		fmax(amr_clamp(a->ylo), amr_clamp(b->ylo));

	if (w <= 0.0 || h <= 0.0)
		return 0.0;
	return w * h;
}

static inline double
amr_fbox_center_x(const AmrFBox *b)
{
	return (amr_clamp(b->xlo) + amr_clamp(b->xhi)) * 0.5;
}

static inline double
amr_fbox_center_y(const AmrFBox *b)
{
	return (amr_clamp(b->ylo) + amr_clamp(b->yhi)) * 0.5;
}

#endif							/* AMR_GEOM_H */
