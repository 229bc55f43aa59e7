/*-------------------------------------------------------------------------
 *
 * amr_geography.c
 *		Keys and distance bounds of PostGIS's geography type (the
 *		geography_ops class of amrtree_postgis).
 *
 * PostGIS answers "a && b" on geographies by comparing their geocentric
 * boxes: the float4 boxes, in three dimensions, of the values as sets of
 * unit vectors (its GIDX, what gist_geography_ops indexes).  amrtree's key
 * is a two-dimensional box, so the key of a geography is the *angular
 * extent* of that geocentric box: the longitudes and latitudes, in
 * degrees, of the directions of all its points.  If two geocentric boxes
 * meet at a point p other than the origin, p's direction lies in both
 * extents, so the keys overlap; if they meet only at the origin, both
 * contain it and both extents are the whole sphere.  So "keys overlap" is
 * implied by "&&", and the index, with the executor's recheck, answers
 * exactly what a sequential scan does.  A projection of the box onto a
 * plane would be as sound, but it folds one hemisphere onto another and
 * loses the latitude near the projection's rim (docs/design.md,
 * "Geography keys").
 *
 * The extent of a box that holds the polar axis (its x-y rectangle holds
 * the origin) spans every longitude; one whose longitudes cross the
 * antimeridian does too, since a key cannot wrap around: sound, and loose
 * only for values across +-180 degrees.
 *
 * The box is PostGIS's own: amrtree_geography_bbox calls the compress
 * function of the type's default GiST operator class, which PostGIS
 * defines as "the GIDX of a value", so it needs no copy of PostGIS's code
 * and follows its rounding.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <math.h>

#include "access/gist.h"
#include "catalog/pg_am_d.h"
#include "commands/defrem.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/geo_decls.h"
#include "utils/lsyscache.h"

PG_FUNCTION_INFO_V1(amrtree_geography_bbox);
PG_FUNCTION_INFO_V1(amrtree_geography_distance);

/*
 * The radius the distance bounds are scaled by: WGS 84's semi-minor axis,
 * below the mean radius ((2a + b) / 3) of every Earth ellipsoid, which is
 * the sphere PostGIS's geography <-> measures on.
 */
#define GEOGRAPHY_BOUND_RADIUS	6356752.0

/*
 * Keys are widened by this many degrees on each side (some 10 micrometres)
 * against the rounding of atan2 and of the conversion to degrees.
 */
#define GEOGRAPHY_KEY_SLACK		1e-10

/* What amrtree_geography_bbox keeps across calls (fn_extra). */
typedef struct GeographyBoxCache
{
	FmgrInfo	compress;		/* the GiST class's "value -> GIDX" */
} GeographyBoxCache;

/*
 * The compress function of the default GiST operator class of the type
 * that fn's first argument has: the geocentric box, as PostGIS indexes it.
 */
static void
lookup_compress(FmgrInfo *fn, FmgrInfo *out)
{
	Oid		   *argtypes;
	int			nargs;
	Oid			argtype;
	Oid			opclass;
	Oid			proc = InvalidOid;

	(void) get_func_signature(fn->fn_oid, &argtypes, &nargs);
	argtype = nargs == 1 ? argtypes[0] : InvalidOid;
	opclass = OidIsValid(argtype) ? GetDefaultOpClass(argtype, GIST_AM_OID) : InvalidOid;
	if (OidIsValid(opclass))
		proc = get_opfamily_proc(get_opclass_family(opclass), argtype, argtype,
								 GIST_COMPRESS_PROC);
	if (!OidIsValid(proc))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("type %s has no default GiST operator class with a compress function",
						OidIsValid(argtype) ? format_type_be(argtype) : "?"),
				 errdetail("amrtree takes the geocentric box of a geography from PostGIS's gist_geography_ops.")));
	fmgr_info_cxt(proc, out, fn->fn_mcxt);
}

/* Widen an angle interval by the slack and clamp it to [lo_limit, hi_limit]. */
static void
widen(double *lo, double *hi, double lo_limit, double hi_limit)
{
	*lo = Max(*lo - GEOGRAPHY_KEY_SLACK, lo_limit);
	*hi = Min(*hi + GEOGRAPHY_KEY_SLACK, hi_limit);
}

/*
 * The angular extent, in degrees, of the directions of the points of the
 * box [x0, x1] x [y0, y1] x [z0, z1]: see the header comment.
 */
static void
angular_extent(double x0, double x1, double y0, double y1, double z0, double z1,
			   BOX *out)
{
	/* the x-y rectangle's nearest and farthest points from the polar axis */
	double		dx = x0 > 0 ? x0 : (x1 < 0 ? -x1 : 0);
	double		dy = y0 > 0 ? y0 : (y1 < 0 ? -y1 : 0);
	double		rmin = hypot(dx, dy);
	double		rmax = hypot(Max(fabs(x0), fabs(x1)), Max(fabs(y0), fabs(y1)));
	double		lat_lo;
	double		lat_hi;
	double		lon_lo;
	double		lon_hi;

	/*
	 * atan2(z, r) grows with z, and with r when z < 0 and falls with r when z
	 * > 0: its extremes over the box are at these corners.
	 */
	lat_hi = atan2(z1, z1 >= 0 ? rmin : rmax) * (180.0 / M_PI);
	lat_lo = atan2(z0, z0 >= 0 ? rmax : rmin) * (180.0 / M_PI);

	if (rmin == 0)
	{
		/* the rectangle holds the polar axis: every longitude */
		lon_lo = -180.0;
		lon_hi = 180.0;
	}
	else
	{
		/*
		 * A rectangle clear of the origin is seen from it under less than 180
		 * degrees, its extreme directions through corners.  Adding 0.0 turns
		 * -0.0 into +0.0, or atan2 would put a corner on the negative x axis
		 * at -180 instead of 180.
		 */
		double		a[4];
		int			i;

		a[0] = atan2(y0 + 0.0, x0 + 0.0);
		a[1] = atan2(y0 + 0.0, x1 + 0.0);
		a[2] = atan2(y1 + 0.0, x0 + 0.0);
		a[3] = atan2(y1 + 0.0, x1 + 0.0);
		lon_lo = lon_hi = a[0];
		for (i = 1; i < 4; i++)
		{
			lon_lo = Min(lon_lo, a[i]);
			lon_hi = Max(lon_hi, a[i]);
		}
		lon_lo *= 180.0 / M_PI;
		lon_hi *= 180.0 / M_PI;
		/* across the antimeridian: a key cannot wrap, so take all of them */
		if (lon_hi - lon_lo > 180.0)
		{
			lon_lo = -180.0;
			lon_hi = 180.0;
		}
	}
	widen(&lon_lo, &lon_hi, -180.0, 180.0);
	widen(&lat_lo, &lat_hi, -90.0, 90.0);
	out->low.x = lon_lo;
	out->high.x = lon_hi;
	out->low.y = lat_lo;
	out->high.y = lat_hi;
}

/*
 * amrtree_geography_bbox(geography) -> box: support function 1 of
 * geography_ops, the key (longitudes and latitudes, in degrees) of a
 * geography; a NaN box for an empty one, which "&&" never matches.
 */
Datum
amrtree_geography_bbox(PG_FUNCTION_ARGS)
{
	GeographyBoxCache *cache = (GeographyBoxCache *) fcinfo->flinfo->fn_extra;
	GISTENTRY	in;
	GISTENTRY  *out;
	struct varlena *gidx;
	const float *c;
	BOX		   *result = palloc(sizeof(BOX));

	if (cache == NULL)
	{
		cache = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(GeographyBoxCache));
		lookup_compress(fcinfo->flinfo, &cache->compress);
		fcinfo->flinfo->fn_extra = cache;
	}
	gistentryinit(in, PG_GETARG_DATUM(0), NULL, NULL, 0, true);
	out = (GISTENTRY *) DatumGetPointer(FunctionCall1(&cache->compress,
													  PointerGetDatum(&in)));
	gidx = (struct varlena *) DatumGetPointer(out->key);

	/*
	 * A GIDX is a varlena of float4 pairs (min, max) per dimension, x, y, z
	 * (and m) for a geography; none for an empty one.
	 */
	if (gidx == NULL || VARSIZE_ANY_EXHDR(gidx) < 6 * sizeof(float))
	{
		result->low.x = result->low.y = get_float8_nan();
		result->high.x = result->high.y = get_float8_nan();
		PG_RETURN_BOX_P(result);
	}
	c = (const float *) VARDATA_ANY(gidx);
	angular_extent(c[0], c[1], c[2], c[3], c[4], c[5], result);
	PG_RETURN_BOX_P(result);
}

/*
 * Lower bounds of sin and cos by their Taylor polynomials, cut after a
 * negative term (alternating series): no libm call in the distance bound,
 * which runs for every node and entry a nearest-neighbour search meets
 * (sin, cos and asin were a fifth of such a query's time).
 *
 * sin x >= x - x^3/6 for x >= 0; the polynomial rises up to sqrt(2), where
 * it is held, so the bound never falls as x grows (sin x > 0.98 there).
 */
static inline double
sin_lower(double x)
{
	x = Min(x, M_SQRT2);
	return x - x * x * x / 6.0;
}

/* cos x >= 1 - x^2/2 + x^4/24 - x^6/720, falling in |x| up to pi/2 */
static inline double
cos_lower(double x)
{
	double		x2 = x * x;

	return Max(0.0, 1.0 - x2 / 2.0 + x2 * x2 / 24.0 - x2 * x2 * x2 / 720.0);
}

/* The smallest cosine of a latitude in [lo, hi] (radians), bounded below. */
static inline double
min_cos_lat(double lo, double hi)
{
	return cos_lower(Min(Max(fabs(lo), fabs(hi)), M_PI_2));
}

/*
 * A lower bound, in metres, of the great-circle distance between a point
 * whose direction lies in key box a and one whose direction lies in key
 * box b (longitudes and latitudes in degrees; see
 * amrtree_geography_distance for the argument).
 */
static double
geography_bound(double alo_lon, double alo_lat, double ahi_lon, double ahi_lat,
				double blo_lon, double blo_lat, double bhi_lon, double bhi_lat)
{
	const double rad = M_PI / 180.0;
	double		lat_gap;
	double		lon_gap;
	double		s;
	double		h;

	if (isnan(alo_lon) || isnan(alo_lat) || isnan(ahi_lon) || isnan(ahi_lat) ||
		isnan(blo_lon) || isnan(blo_lat) || isnan(bhi_lon) || isnan(bhi_lat))
		return 0.0;
	alo_lon = Max(alo_lon, -180.0);
	ahi_lon = Min(ahi_lon, 180.0);
	alo_lat = Max(alo_lat, -90.0);
	ahi_lat = Min(ahi_lat, 90.0);
	blo_lon = Max(blo_lon, -180.0);
	bhi_lon = Min(bhi_lon, 180.0);
	blo_lat = Max(blo_lat, -90.0);
	bhi_lat = Min(bhi_lat, 90.0);

	lat_gap = Max(0.0, Max(alo_lat - bhi_lat, blo_lat - ahi_lat));
	if (ahi_lon < blo_lon)
		lon_gap = Min(blo_lon - ahi_lon, alo_lon + 360.0 - bhi_lon);
	else if (bhi_lon < alo_lon)
		lon_gap = Min(alo_lon - bhi_lon, blo_lon + 360.0 - ahi_lon);
	else
		lon_gap = 0.0;
	lon_gap = Max(0.0, Min(lon_gap, 180.0));

	s = sin_lower(lat_gap * rad / 2.0);
	h = s * s;
	if (lon_gap > 0)
	{
		double		sl = sin_lower(lon_gap * rad / 2.0);

		h += min_cos_lat(alo_lat * rad, ahi_lat * rad) *
			min_cos_lat(blo_lat * rad, bhi_lat * rad) * sl * sl;
	}

	/*
	 * d = 2 asin(sqrt(hav d)) >= 2 sqrt(h), as asin x >= x.  Rounding: the
	 * relative error of h is a few units in the last place; shave a millionth
	 * of the result and a millimetre off it, far above both, so the bound
	 * stays below what PostGIS computes.
	 */
	return Max(0.0, 2.0 * sqrt(Min(h, 1.0)) * GEOGRAPHY_BOUND_RADIUS * (1.0 - 1e-6) - 1e-3);
}

double
amr_geography_bound(const AmrFBox *b, const AmrBox *q, void *arg)
{
	return geography_bound(b->xlo, b->ylo, b->xhi, b->yhi, q->xlo, q->ylo, q->xhi, q->yhi);
}

bool
amr_is_geography_bound(const FmgrInfo *fn)
{
	return fn->fn_addr == amrtree_geography_distance;
}

/*
 * amrtree_geography_distance(box, box) -> float8: support function 3 of
 * geography_ops.  A lower bound, in metres, of the distance geography's
 * <-> gives (on a sphere of the SRID's mean radius) between any value whose
 * key lies in the first box and any value whose key lies in the second.
 *
 * By the haversine formula, hav(d) = hav(lat1 - lat2) + cos(lat1) cos(lat2)
 * hav(lon1 - lon2); each term is at least its value at the boxes' gap in
 * latitude, the smallest cosines, and the gap in longitude (around the
 * circle), and the sines and cosines are bounded below by polynomials, so
 * d is at least 2 sqrt of that sum.  Larger boxes have smaller gaps and
 * cosines, so a box never gets a larger bound than a box inside it.  NaN
 * keys (empty values) get 0.  amrtree calls the computation directly
 * (amr_geography_bound) when an operator class names this function.
 */
Datum
amrtree_geography_distance(PG_FUNCTION_ARGS)
{
	BOX		   *a = PG_GETARG_BOX_P(0);
	BOX		   *b = PG_GETARG_BOX_P(1);

	PG_RETURN_FLOAT8(geography_bound(a->low.x, a->low.y, a->high.x, a->high.y,
									 b->low.x, b->low.y, b->high.x, b->high.y));
}
