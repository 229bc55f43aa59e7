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

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Same value as EPSILON in PostgreSQL's utils/geo_decls.h */
#define AMR_EPSILON 1.0E-06

/*
 * Powers of two for the distance bounds below.  Each decimal literal is the
 * shortest that converts to exactly that power; pgindent cannot lay out
 * hexadecimal floating-point literals.
 */
#define AMR_2_POW_MINUS_40 9.094947017729282e-13
#define AMR_2_POW_MINUS_48 3.552713678800501e-15
#define AMR_2_POW_MINUS_50 8.881784197001252e-16
#define AMR_2_POW_MINUS_900 1.1830521861667747e-271

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

/*
 * Relaxed forms of the strategies whose box predicate is not implied by
 * every type's operator (internal numbers, never in a catalog).  For a
 * lossy operator class the key is only a bounding box and the operator is
 * rechecked on the heap tuple, so the index must keep every row for which
 * the operator *may* hold: its filter has to be a necessary condition of
 * the operator whatever that operator's comparison style is -- exact (the
 * polygon operators compare bounding boxes with <, PostGIS compares float4
 * boxes) or fuzzy (points and circles use EPSILON).  box_left's
 * "a + EPSILON < b" is stricter than an exact "a < b", so LEFT, RIGHT,
 * BELOW and ABOVE become "<= b + EPSILON"; circle ~= compares centre and
 * radius with EPSILON each, so its boxes may differ by twice that.  The
 * other strategies are already necessary conditions in their fuzzy form.
 */
#define AMR_STRAT_RELAXED_OFFSET	100
#define AMR_STRAT_LEFT_RELAXED		(AMR_STRAT_RELAXED_OFFSET + AMR_STRAT_LEFT)
#define AMR_STRAT_RIGHT_RELAXED		(AMR_STRAT_RELAXED_OFFSET + AMR_STRAT_RIGHT)
#define AMR_STRAT_SAME_RELAXED		(AMR_STRAT_RELAXED_OFFSET + AMR_STRAT_SAME)
#define AMR_STRAT_BELOW_RELAXED		(AMR_STRAT_RELAXED_OFFSET + AMR_STRAT_BELOW)
#define AMR_STRAT_ABOVE_RELAXED		(AMR_STRAT_RELAXED_OFFSET + AMR_STRAT_ABOVE)

/*
 * point <@ polygon (point_ops' strategy 48), filtered as contained-by the
 * polygon's bounding box.  PostgreSQL's point_inside() is a crossing count,
 * not a conjunction of comparisons, so the widening of NaN sides to
 * infinity (amr_fbox_from_box) is no valid bound for it: for a point whose
 * y is NaN every edge that does not lie wholly to the point's left counts
 * as a crossing, so (x, NaN) is "inside" every polygon with a vertex at or
 * right of x - EPSILON, wherever the polygon's y range is.  Such a key's
 * box is infinite in y, so an inner box infinite on both y sides admits
 * the subtree when its west edge is not east of the polygon's; otherwise
 * the test is the overlap of contained-by.  (A query polygon with an
 * infinite coordinate can meet an infinite point coordinate in inf - inf,
 * a NaN again: amr_scankey_from_pg prunes nothing for it.)
 */
#define AMR_STRAT_POINT_IN_POLYGON_RELAXED	(AMR_STRAT_RELAXED_OFFSET + 48)

/* The strategy a lossy operator class filters with (see above). */
static inline int
amr_relaxed_strategy(int strategy)
{
	switch (strategy)
	{
		case AMR_STRAT_LEFT:
		case AMR_STRAT_RIGHT:
		case AMR_STRAT_SAME:
		case AMR_STRAT_BELOW:
		case AMR_STRAT_ABOVE:
			return strategy + AMR_STRAT_RELAXED_OFFSET;
	}
	return strategy;
}

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

/* amr_fp_eq with twice the tolerance (see AMR_STRAT_SAME_RELAXED). */
static inline bool
amr_fp_eq2(double a, double b)
{
	return a == b || fabs(a - b) <= 2 * AMR_EPSILON;
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
		case AMR_STRAT_POINT_IN_POLYGON_RELAXED:
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
		case AMR_STRAT_LEFT_RELAXED:
			return amr_fp_le(k->xhi, q->xlo);
		case AMR_STRAT_RIGHT_RELAXED:
			return amr_fp_ge(k->xlo, q->xhi);
		case AMR_STRAT_BELOW_RELAXED:
			return amr_fp_le(k->yhi, q->ylo);
		case AMR_STRAT_ABOVE_RELAXED:
			return amr_fp_ge(k->ylo, q->yhi);
		case AMR_STRAT_SAME_RELAXED:
			return amr_fp_eq2(k->xhi, q->xhi) && amr_fp_eq2(k->xlo, q->xlo) &&
				amr_fp_eq2(k->yhi, q->yhi) && amr_fp_eq2(k->ylo, q->ylo);
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
		case AMR_STRAT_LEFT_RELAXED:
			return amr_fp_le(m->xlo, q->xlo);
		case AMR_STRAT_RIGHT_RELAXED:
			return amr_fp_ge(m->xhi, q->xhi);
		case AMR_STRAT_BELOW_RELAXED:
			return amr_fp_le(m->ylo, q->ylo);
		case AMR_STRAT_ABOVE_RELAXED:
			return amr_fp_ge(m->yhi, q->yhi);
		case AMR_STRAT_POINT_IN_POLYGON_RELAXED:
			if (m->ylo == -INFINITY && m->yhi == INFINITY && amr_fp_le(m->xlo, q->xhi))
				return true;	/* may hold (x, NaN) with x west of q's east */
			return amr_fp_le(m->xlo, q->xhi) && amr_fp_le(q->xlo, m->xhi) &&
				amr_fp_le(m->ylo, q->yhi) && amr_fp_le(q->ylo, m->yhi);
		case AMR_STRAT_SAME_RELAXED:
			return m->xhi + 2 * AMR_EPSILON >= q->xhi && m->xlo <= q->xlo + 2 * AMR_EPSILON &&
				m->yhi + 2 * AMR_EPSILON >= q->yhi && m->ylo <= q->ylo + 2 * AMR_EPSILON;
	}
	/* unknown strategy: never prune */
	return true;
}

/*
 * The float4 next below / above f (f not NaN, and not -Infinity /
 * +Infinity respectively): nextafterf's answer, by a step of the bit
 * pattern.  Inline, because the build rounds four coordinates a row and
 * libm's nextafterf (a call, and errno through thread-local storage) was a
 * tenth of a build's time.
 */
static inline float
amr_float_below(float f)
{
	uint32_t	u;

	if (f == 0.0f)
		return -FLT_TRUE_MIN;
	memcpy(&u, &f, sizeof(u));
	u = f > 0.0f ? u - 1 : u + 1;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline float
amr_float_above(float f)
{
	uint32_t	u;

	if (f == 0.0f)
		return FLT_TRUE_MIN;
	memcpy(&u, &f, sizeof(u));
	u = f > 0.0f ? u + 1 : u - 1;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Round a float8 down / up to the nearest float4 that does not cut the box. */
static inline float
amr_round_down(double v)
{
	float		f = (float) v;

	if ((double) f > v)
		f = amr_float_below(f);
	return f;
}

static inline float
amr_round_up(double v)
{
	float		f = (float) v;

	if ((double) f < v)
		f = amr_float_above(f);
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

/* ---- Distances for KNN ("ORDER BY key <-> point", strategy 15) ---- */

/* A point: the query of a KNN search, or a key of a future point opclass. */
typedef struct AmrPoint
{
	double		x;
	double		y;
} AmrPoint;

/*
 * PostgreSQL's float8 "<" (float8_lt in utils/float.h): NaN is larger than
 * everything, including +Inf, and equal to itself.  KNN orders by this.
 */
static inline bool
amr_float8_lt(double a, double b)
{
	return !isnan(a) && (isnan(b) || a < b);
}

/* PostgreSQL's float8 "=" (float8_eq): NaN equals NaN. */
static inline bool
amr_float8_eq(double a, double b)
{
	return isnan(a) ? isnan(b) : (!isnan(b) && a == b);
}

/*
 * pg_hypot() of PostgreSQL 15 (utils/adt/geo_ops.c), the HYPOT() that every
 * geometric distance uses: an infinite argument gives +Inf even beside a
 * NaN, then NaN gives NaN, then |x| * sqrt(1 + (|y|/|x|)^2) with |x| the
 * larger.  The same operations in the same order give the same bits.
 * PostgreSQL raises "value out of range: overflow" where the result
 * overflows; this returns +Inf (see amr_dist_box_point).
 *
 * The build targets baseline x86-64 (no FMA), as Debian's PostgreSQL does,
 * so "1.0 + ratio * ratio" is a multiply and an add, rounded twice, there
 * as here.
 */
static inline double
amr_pg_hypot(double x, double y)
{
	double		ratio;

	if (isinf(x) || isinf(y))
		return INFINITY;
	if (isnan(x) || isnan(y))
		return NAN;
	x = fabs(x);
	y = fabs(y);
	if (x < y)
	{
		double		larger = y;

		y = x;
		x = larger;
	}
	if (y == 0.0)
		return x;
	ratio = y / x;
	return x * sqrt(1.0 + ratio * ratio);
}

/*
 * point_dt() of geo_ops.c: HYPOT(x1 - x2, y1 - y2).  PostgreSQL's float8_mi
 * raises an error when a difference of finite values overflows; here the
 * difference is +-Inf and so is the distance.
 */
static inline double
amr_pg_point_dt(double x1, double y1, double x2, double y2)
{
	return amr_pg_hypot(x1 - x2, y1 - y2);
}

/*
 * "point <-> point" (point_distance in geo_ops.c), for a future point
 * opclass whose keys are degenerate boxes: the key's low corner is the
 * point.
 */
static inline double
amr_dist_point_point(const AmrPoint *a, const AmrPoint *b)
{
	return amr_pg_point_dt(a->x, a->y, b->x, b->y);
}

/*
 * A lower bound of amr_dist_point_point(a, b) without its square root: the
 * larger difference along the axes (pg_hypot(x, y) >= max(|x|, |y|)
 * exactly; a NaN difference is ignored, and the distance is then NaN, which
 * float8 orders last).
 */
static inline double
amr_point_point_axis_bound(const AmrPoint *a, const AmrPoint *b)
{
	return fmax(fabs(a->x - b->x), fabs(a->y - b->y));
}

/* point_eq_point() of geo_ops.c: fuzzy, except that NaN must match NaN. */
static inline bool
amr_pg_point_eq(double x1, double y1, double x2, double y2)
{
	if (isnan(x1) || isnan(y1) || isnan(x2) || isnan(y2))
		return amr_float8_eq(x1, x2) && amr_float8_eq(y1, y2);
	return amr_fp_eq(x1, x2) && amr_fp_eq(y1, y2);
}

/*
 * Where the vertical line x = c meets the horizontal line y = d, computed
 * as line_interpt_line() computes it from the LINE forms (-1)x + 0y + c = 0
 * and 0x + (-1)y + d = 0.  Both operand orders of that function reduce to
 * these expressions.  They are not simply (c, d): 0 * Inf is NaN, so an
 * infinite d makes x NaN, and an infinite x makes y NaN.  Those NaNs are
 * part of PostgreSQL's answer for infinite boxes and points.
 */
static inline void
amr_pg_cross_point(double c, double d, double *x, double *y)
{
	double		px = (-c - 0.0 * d) / -1.0;
	double		py = -(0.0 * px + d) / -1.0;

	/* line_interpt_line() turns -0 into 0; the sign never reaches a result */
	*x = (px == 0.0) ? 0.0 : px;
	*y = (py == 0.0) ? 0.0 : py;
}

/*
 * lseg_closept_point() of geo_ops.c, for a segment p0-p1 parallel to an
 * axis (a box edge), reduced to the lines it constructs: the result is the
 * distance from q to a "closest point" c of the segment, found as follows.
 *
 * The segment counts as vertical when FPeq(p0.x, p1.x) (point_sl() gives
 * Inf, point_invsl() gives 0), so a horizontal edge of a box narrower than
 * EPSILON is treated as vertical, through p0.  The perpendicular through q
 * meets the segment's line at i; i counts as on the segment when
 * FPeq(|i p0| + |i p1|, |p0 p1|) (lseg_contain_point()), and then c is i,
 * or an endpoint point_eq_point() finds equal to i.  Otherwise c is the
 * endpoint nearer to the perpendicular (line_closept_point(); on a tie or
 * NaN, p1).
 *
 * The EPSILON fuzz, and infinite edges (|i p1| = |p0 p1| = Inf makes every
 * i "on" the segment), mean that c may lie off the segment, so the result
 * can be smaller than the true distance to the box: amr_fbox_point_lower_bound
 * allows for that.
 */
static inline double
amr_pg_axis_lseg_closept_dist(double p0x, double p0y, double p1x, double p1y,
							  double qx, double qy)
{
	bool		vertical = amr_fp_eq(p0x, p1x);
	double		ix,
				iy,
				cx,
				cy;

	/* lseg_interpt_line(): the segment's line meets the perpendicular */
	if (vertical)
		amr_pg_cross_point(p0x, qy, &ix, &iy);
	else
		amr_pg_cross_point(qx, p0y, &ix, &iy);

	if (amr_fp_eq(amr_pg_point_dt(ix, iy, p0x, p0y) +
				  amr_pg_point_dt(ix, iy, p1x, p1y),
				  amr_pg_point_dt(p0x, p0y, p1x, p1y)))
	{
		if (amr_pg_point_eq(p0x, p0y, ix, iy))
		{
			cx = p0x;
			cy = p0y;
		}
		else if (amr_pg_point_eq(p1x, p1y, ix, iy))
		{
			cx = p1x;
			cy = p1y;
		}
		else
		{
			cx = ix;
			cy = iy;
		}
	}
	else
	{
		/*
		 * lseg_closept_line(): each endpoint's distance to the perpendicular,
		 * measured from where a line through the endpoint, perpendicular to
		 * the perpendicular, meets it (line_closept_point()).
		 */
		double		fx,
					fy,
					d0,
					d1;

		if (vertical)
			amr_pg_cross_point(p0x, qy, &fx, &fy);
		else
			amr_pg_cross_point(qx, p0y, &fx, &fy);
		d0 = amr_pg_point_dt(fx, fy, p0x, p0y);
		if (vertical)
			amr_pg_cross_point(p1x, qy, &fx, &fy);
		else
			amr_pg_cross_point(qx, p1y, &fx, &fy);
		d1 = amr_pg_point_dt(fx, fy, p1x, p1y);
		if (d0 < d1)
		{
			cx = p0x;
			cy = p0y;
		}
		else
		{
			cx = p1x;
			cy = p1y;
		}
	}
	return amr_pg_point_dt(cx, cy, qx, qy);
}

/*
 * "box <-> point" exactly as PostgreSQL 15 computes it: dist_bp() ->
 * box_closept_point() in src/backend/utils/adt/geo_ops.c.  0 when q is in
 * the box or on its border (exact comparisons, no EPSILON); otherwise the
 * smallest non-NaN distance to the four edges, taken in PostgreSQL's order
 * (left edge from the low corner, top edge from the high corner, bottom edge
 * from the low corner, right edge from the high corner), each computed by
 * amr_pg_axis_lseg_closept_dist; NaN only if all four are NaN.  This is not
 * the clamp-and-hypot distance: within EPSILON of an edge or a corner, for
 * boxes thinner than EPSILON and for infinite boxes the results differ, and
 * ORDER BY must agree with the operator that a sequential scan evaluates.
 *
 * Where PostgreSQL raises "value out of range: overflow" (differences or
 * distances of coordinates near +-1e308), this returns +Inf: the executor
 * raises the error itself when it evaluates the operator on that row.
 * b must not have NaN coordinates (amrtree rejects such keys); q may.
 */
static inline double
amr_dist_box_point(const AmrBox *b, const AmrPoint *q)
{
	double		dist,
				d;

	/* box_contain_point() */
	if (b->xhi >= q->x && b->xlo <= q->x && b->yhi >= q->y && b->ylo <= q->y)
		return 0.0;

	dist = amr_pg_axis_lseg_closept_dist(b->xlo, b->ylo, b->xlo, b->yhi, q->x, q->y);
	d = amr_pg_axis_lseg_closept_dist(b->xhi, b->yhi, b->xlo, b->yhi, q->x, q->y);
	if (amr_float8_lt(d, dist))
		dist = d;
	d = amr_pg_axis_lseg_closept_dist(b->xlo, b->ylo, b->xhi, b->ylo, q->x, q->y);
	if (amr_float8_lt(d, dist))
		dist = d;
	d = amr_pg_axis_lseg_closept_dist(b->xhi, b->yhi, b->xhi, b->ylo, q->x, q->y);
	if (amr_float8_lt(d, dist))
		dist = d;
	return dist;
}

/*
 * How much of a gap along one axis PostgreSQL's fuzz may absorb, for a query
 * coordinate q and a box's edges lo, hi: EPSILON plus the rounding of their
 * magnitudes (Inf when one is infinite: then only the other axis's gap is a
 * bound).
 */
static inline double
amr_fuzz_slack(double q, double lo, double hi)
{
	return 1.0001e-6 + AMR_2_POW_MINUS_50 * (fabs(q) + fabs(lo) + fabs(hi));
}

/*
 * A distance bound for gaps dx, dy along the axes, lowered for the fuzz:
 * where one gap is within its slack, only the other axis's gap is a bound.
 */
static inline double
amr_fuzz_lowered(double bound, double dx, double dy, double slack_x, double slack_y)
{
	if (dy <= slack_y && dx < bound)
		bound = dx;
	if (dx <= slack_x && dy < bound)
		bound = dy;
	return bound;
}

/*
 * A lower bound of the distance PostgreSQL computes across gaps dx, dy along
 * the axes: their hypotenuse, lowered for pg_hypot's rounding.
 */
static inline double
amr_gap_distance(double dx, double dy)
{
	if (dx == 0.0 || dy == 0.0)
		return dx + dy;			/* pg_hypot(v, 0) is exactly v */
	if (fmax(dx, dy) < AMR_2_POW_MINUS_900)
		return fmax(dx, dy);	/* no relative error bound near denormals */
	return amr_pg_hypot(dx, dy) * (1.0 - AMR_2_POW_MINUS_48);
}

/*
 * The distance bound for gaps dx, dy along the axes (a float4 box's to the
 * query), allowing for PostgreSQL's fuzz: slack_x, slack_y are how much of
 * each gap the fuzz may absorb (amr_fuzz_lowered).
 */
static inline double
amr_gap_lower_bound(double dx, double dy, double slack_x, double slack_y)
{
	return amr_fuzz_lowered(amr_gap_distance(dx, dy), dx, dy, slack_x, slack_y);
}

/*
 * A lower bound of amr_dist_box_point(b, q) for every box b inside the
 * float4 box m (and so of amr_dist_point_point for every point inside m).
 * Outward rounding makes m larger than the float8 boxes it covers, which
 * can only lower this bound, so a bound taken from an inner node's or a
 * level-1 entry's box holds for every key below it.
 *
 * With dx, dy the per-axis distances from q to m, the true distance from q
 * to b is at least hypot(dx, dy), and amr_dist_box_point's "closest point"
 * is a corner of b, or a point of an edge's line: (edge x, q.y) on a
 * vertical edge, at distance >= dx, or (q.x, edge y) on a horizontal one, at
 * distance >= dy.  Such a point lies off b only when lseg_contain_point()'s
 * fuzz accepts it, which needs q within about EPSILON (plus rounding of the
 * coordinates' magnitude) of m along the edge, or an infinite edge.  So the
 * bound is hypot(dx, dy), lowered to dx when dy is within that slack and to
 * dy when dx is.  (Rounding: float8 subtraction is monotone, so every
 * coordinate difference PostgreSQL computes is at least dx or dy, and
 * pg_hypot is within 4 ulps of the true hypotenuse: the 2^-48 reduction
 * covers both.)  A query with a NaN coordinate gets 0: its distances are
 * NaN or Inf, and it prunes nothing.
 */
static inline double
amr_fbox_point_lower_bound(const AmrFBox *m, const AmrPoint *q)
{
	double		dx,
				dy,
				slack_x,
				slack_y;

	if (isnan(q->x) || isnan(q->y))
		return 0.0;
	if (q->x < m->xlo)
		dx = (double) m->xlo - q->x;
	else if (q->x > m->xhi)
		dx = q->x - (double) m->xhi;
	else
		dx = 0.0;
	if (q->y < m->ylo)
		dy = (double) m->ylo - q->y;
	else if (q->y > m->yhi)
		dy = q->y - (double) m->yhi;
	else
		dy = 0.0;

	slack_y = amr_fuzz_slack(q->y, (double) m->ylo, (double) m->yhi);
	slack_x = amr_fuzz_slack(q->x, (double) m->xlo, (double) m->xhi);
	return amr_gap_lower_bound(dx, dy, slack_x, slack_y);
}

/*
 * A cheaper lower bound of amr_dist_box_point(b, q) for a key b (no NaN):
 * the larger of the two gaps along the axes, which the distance is never
 * below (pg_hypot(x, y) >= max(x, y) exactly), lowered to the other gap
 * where PostgreSQL's fuzz may put the closest point off the box, as in
 * amr_fbox_point_lower_bound.  No square root and no rounding to float4: an
 * ordered scan queues every entry of a leaf it reads under this bound, and
 * computes the distance only of those that reach the head of its queue.
 */
static inline double
amr_box_point_axis_bound(const AmrBox *b, const AmrPoint *q)
{
	double		dx,
				dy,
				bound;

	if (isnan(q->x) || isnan(q->y))
		return 0.0;
	dx = q->x < b->xlo ? b->xlo - q->x : (q->x > b->xhi ? q->x - b->xhi : 0.0);
	dy = q->y < b->ylo ? b->ylo - q->y : (q->y > b->yhi ? q->y - b->yhi : 0.0);
	bound = fmax(dx, dy);
	if (bound == 0.0)
		return 0.0;
	return amr_fuzz_lowered(bound, dx, dy, amr_fuzz_slack(q->x, b->xlo, b->xhi),
							amr_fuzz_slack(q->y, b->ylo, b->yhi));
}

/*
 * The gaps between the float4 box m and the box q along each axis, and how
 * much of each PostgreSQL's fuzz may absorb (from the magnitudes of both of
 * the query's edges).
 */
static inline void
amr_fbox_box_gaps(const AmrFBox *m, const AmrBox *q, double *dx, double *dy,
				  double *slack_x, double *slack_y)
{
	if (q->xhi < m->xlo)
		*dx = (double) m->xlo - q->xhi;
	else if (q->xlo > m->xhi)
		*dx = q->xlo - (double) m->xhi;
	else
		*dx = 0.0;
	if (q->yhi < m->ylo)
		*dy = (double) m->ylo - q->yhi;
	else if (q->ylo > m->yhi)
		*dy = q->ylo - (double) m->yhi;
	else
		*dy = 0.0;
	*slack_x = amr_fuzz_slack(fabs(q->xlo) + fabs(q->xhi), (double) m->xlo, (double) m->xhi);
	*slack_y = amr_fuzz_slack(fabs(q->ylo) + fabs(q->yhi), (double) m->ylo, (double) m->yhi);
}

/*
 * A lower bound of the distance between any box inside m and any value
 * inside the box q: for a degenerate q exactly amr_fbox_point_lower_bound
 * (so point queries order as before), otherwise the gap between the boxes
 * along each axis, combined and slackened the same way.  A NaN in q prunes
 * nothing.
 */
static inline double
amr_fbox_box_lower_bound(const AmrFBox *m, const AmrBox *q)
{
	double		dx,
				dy,
				bound,
				slack_x,
				slack_y;

	if (q->xlo == q->xhi && q->ylo == q->yhi)
	{
		AmrPoint	p = {q->xlo, q->ylo};

		return amr_fbox_point_lower_bound(m, &p);
	}
	if (amr_box_has_nan(q))
		return 0.0;
	amr_fbox_box_gaps(m, q, &dx, &dy, &slack_x, &slack_y);
	bound = amr_gap_lower_bound(dx, dy, slack_x, slack_y);
	/* a gap smaller than the slack may be PostgreSQL's fuzz: no bound */
	if (bound <= fmax(slack_x, slack_y))
		bound = 0.0;
	return bound;
}

/*
 * A bound from amr_fbox_box_lower_bound(m, q), lowered so that it is also a
 * lower bound of the distance PostgreSQL computes for a value of a lossy
 * operator class (circle_ops, poly_ops) inside m, which the executor
 * compares it with ("index returned tuples in wrong order" when it is
 * below).  That bound covers the rounding of a box's distance, but those
 * classes compute theirs by other formulas: dist_cpoint() takes
 * pg_hypot(centre - point) - radius, whose rounding (of the coordinates'
 * differences, the hypotenuse and the subtraction, a few ulps of the
 * magnitudes involved) can put it below the gap to the box when the box's
 * edge is exact and the gap small against the magnitudes -- a circle of
 * radius 1e6 seen from x = 8e14, or of radius 10 from y = -3e13, where
 * the exact distance lost up to 0.125 to the rounding; dist_ppoly() goes
 * through the edges' lines.  So the bound is lowered by 2^-40 of the sum of
 * the largest magnitudes of both boxes along each axis (an absolute error
 * of some 2^-50 of the magnitudes, with room to spare).  The slack grows
 * with the box, so a bound still never exceeds the bound of a box inside
 * it: an inner node's stays at most its children's.
 */
static inline double
amr_lossy_lower_bound(double bound, const AmrFBox *m, const AmrBox *q)
{
	double		slack,
				dx,
				dy,
				sx,
				sy;

	if (!(bound > 0.0))
		return bound;
	slack = AMR_2_POW_MINUS_40 *
		(fmax(fabs((double) m->xlo), fabs((double) m->xhi)) +
		 fmax(fabs((double) m->ylo), fabs((double) m->yhi)) +
		 fmax(fabs(q->xlo), fabs(q->xhi)) +
		 fmax(fabs(q->ylo), fabs(q->yhi)));
	bound = bound > slack ? bound - slack : 0.0;

	/*
	 * dist_ppoly() is 0 when point_inside() puts the point on the polygon,
	 * which its EPSILON comparisons (lseg_crossing) do for a point within
	 * EPSILON of a vertex along both axes -- outside the polygon's box, so
	 * the gap to the box is no bound -- and the closest point it takes on an
	 * edge may lie up to EPSILON/2 beyond the edge's end
	 * (lseg_contain_point's FPeq).  So the bound is also at most the distance
	 * to m grown by the fuzz slack on every side: 0 within it. Growing a
	 * larger box by its (larger) slack keeps a node's bound at most its
	 * children's.
	 */
	amr_fbox_box_gaps(m, q, &dx, &dy, &sx, &sy);
	dx = dx > sx ? dx - sx : 0.0;
	dy = dy > sy ? dy - sy : 0.0;
	return fmin(bound, amr_gap_distance(dx, dy));
}

#endif							/* AMR_GEOM_H */
