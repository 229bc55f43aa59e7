/*-------------------------------------------------------------------------
 *
 * amr_opclass.c
 *		The operator-class layer: what the tree core's boxes mean for each
 *		indexed type.
 *
 * The tree core knows one kind of key, a float8 box, and twelve box
 * relations.  An operator class connects a type to it:
 *
 *	- box_ops indexes box itself.  Keys are exact: leaves evaluate box_ops'
 *	  operators exactly (amr_leaf_match reproduces geo_ops.c), index-only
 *	  scans return the stored box, and ORDER BY box <-> point distances are
 *	  exact.
 *	- A type whose value a box represents exactly (point) names support
 *	  function 1, "the box of a value" (T -> box), and support function 2,
 *	  "the value of a box" (box -> T, GiST's fetch).  The index filters
 *	  with a relaxed box relation (below) and then evaluates the operator
 *	  itself on the value, so results are exact: no recheck, index-only
 *	  scans return the value, and KNN distances are the operator's own.
 *	- Any other type names support function 1 only, "the bounding box of a
 *	  value" (T -> box), as GiST's compress does.  Keys are then bounding
 *	  boxes: the index filters with a relaxed box relation that every value
 *	  satisfying the operator also satisfies (amr_relaxed_strategy), and the
 *	  executor rechecks the operator on the heap tuple (xs_recheck); a KNN
 *	  distance is a lower bound, and the executor reorders by the exact one
 *	  (xs_recheckorderby).  A query argument of another type than box and
 *	  the indexed type (point <@ polygon) is mapped by support function 1
 *	  registered in the operator family for that type.
 *
 * Strategy numbers are GiST's: 1-12 the box relations, 15 the distance
 * ordering, and point_ops' 28/48/68 ("<@ box / polygon / circle", filtered
 * as contained-by of the bounding box) and 29/30 (the old names <^ and >^
 * of below and above).
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <float.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "utils/syscache.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/fmgrprotos.h"
#include "utils/geo_decls.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "parser/parse_func.h"
#include "nodes/makefuncs.h"
#include "nodes/value.h"
#include "utils/rel.h"

int
amr_strategy_relation(int strategy)
{
	if (strategy >= 1 && strategy <= AMR_NUM_STRATEGIES)
		return strategy;
	switch (strategy)
	{
		case AMR_STRAT_POINT_IN_BOX:
		case AMR_STRAT_POINT_IN_POLYGON:
		case AMR_STRAT_POINT_IN_CIRCLE:
			return AMR_STRAT_CONTAINED_BY;
		case AMR_STRAT_OLD_BELOW:
			return AMR_STRAT_BELOW;
		case AMR_STRAT_OLD_ABOVE:
			return AMR_STRAT_ABOVE;
	}
	return 0;
}

bool
amr_opclass_exact(Relation index)
{
	return index->rd_opcintype[0] == BOXOID;
}

bool
amr_opclass_keys_exact(Relation index)
{
	return amr_opclass_exact(index) ||
		OidIsValid(index_getprocid(index, 1, AMR_FETCH_PROC));
}

Datum
amr_key_value(Relation index, const AmrBox *key)
{
	BOX		   *b = amr_box_to_pg(key);

	if (amr_opclass_exact(index))
		return BoxPGetDatum(b);
	return FunctionCall1Coll(index_getprocinfo(index, 1, AMR_FETCH_PROC),
							 index->rd_indcollation[0], BoxPGetDatum(b));
}

/* Call a bounding-box support function and take its box. */
static void
call_bbox_fn(FmgrInfo *fn, Oid collation, Datum value, AmrBox *out)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		result;

	InitFunctionCallInfoData(*fcinfo, fn, 1, collation, NULL, NULL);
	fcinfo->args[0].value = value;
	fcinfo->args[0].isnull = false;
	result = FunctionCallInvoke(fcinfo);
	if (fcinfo->isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("bounding-box function %s of an amrtree operator class returned NULL",
						format_procedure(fn->fn_oid)),
				 errhint("Support function 1 must return a box for every non-NULL value; a box with NaN coordinates stands for a value without extent.")));
	amr_box_from_pg(DatumGetBoxP(result), out);
}

void
amr_box_from_datum(Relation index, Datum d, AmrBox *out)
{
	if (amr_opclass_exact(index))
		amr_box_from_pg(DatumGetBoxP(d), out);
	else
		call_bbox_fn(index_getprocinfo(index, 1, AMR_BBOX_PROC),
					 index->rd_indcollation[0], d, out);
}

void
amr_query_box(Relation index, Oid argtype, Datum arg, FmgrInfo *cache,
			  MemoryContext cxt, AmrBox *out)
{
	Oid			proc;

	Assert(OidIsValid(argtype));
	if (argtype == BOXOID)
	{
		amr_box_from_pg(DatumGetBoxP(arg), out);
		return;
	}
	if (argtype == index->rd_opcintype[0])
	{
		amr_box_from_datum(index, arg, out);
		return;
	}
	if (cache == NULL || cache->fn_oid == InvalidOid)
	{
		proc = get_opfamily_proc(index->rd_opfamily[0], argtype, argtype, AMR_BBOX_PROC);
		if (!OidIsValid(proc))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_FUNCTION),
					 errmsg("operator family of amrtree index \"%s\" has no bounding-box function for type %s",
							RelationGetRelationName(index), format_type_be(argtype)),
					 errhint("Add support function 1 for %s to the operator family.",
							 format_type_be(argtype))));
		if (cache == NULL)
		{
			FmgrInfo	fn;

			fmgr_info(proc, &fn);
			call_bbox_fn(&fn, InvalidOid, arg, out);
			return;
		}
		fmgr_info_cxt(proc, cache, cxt);
	}
	call_bbox_fn(cache, InvalidOid, arg, out);
}

bool
amr_scankey_from_pg(Relation index, int strategy, Oid argtype, Datum arg,
					FmgrInfo *cache, MemoryContext cxt, AmrScanKey *k)
{
	int			relation = amr_strategy_relation(strategy);
	bool		lossy;

	if (relation == 0)
		elog(ERROR, "unrecognized strategy number %d for amrtree", strategy);
	lossy = !amr_opclass_exact(index) || argtype != BOXOID;
	amr_query_box(index, argtype, arg, cache, cxt, &k->query);
	k->strategy = lossy ? amr_relaxed_strategy(relation) : relation;
	k->prune = !amr_box_has_nan(&k->query);
	if (strategy == AMR_STRAT_POINT_IN_POLYGON)
	{
		/*
		 * point_inside() is no box relation: see
		 * AMR_STRAT_POINT_IN_POLYGON_RELAXED.  An infinite vertex can meet an
		 * infinite point coordinate in inf - inf, and the NaN that gives
		 * makes points far outside the polygon's box "inside"; such a query
		 * is decided by the operator on every key.
		 */
		k->strategy = AMR_STRAT_POINT_IN_POLYGON_RELAXED;
		if (isinf(k->query.xlo) || isinf(k->query.ylo) ||
			isinf(k->query.xhi) || isinf(k->query.yhi))
			k->prune = false;
	}
	return lossy;
}

/* ---- bounding boxes of the built-in geometric types (support function 1) ---- */

PG_FUNCTION_INFO_V1(amrtree_point_bbox);
PG_FUNCTION_INFO_V1(amrtree_point_fetch);
PG_FUNCTION_INFO_V1(amrtree_poly_bbox);
PG_FUNCTION_INFO_V1(amrtree_circle_bbox);
PG_FUNCTION_INFO_V1(amrtree_float4_bbox);

/* A point's box: the point itself, degenerate. */
Datum
amrtree_point_bbox(PG_FUNCTION_ARGS)
{
	Point	   *p = PG_GETARG_POINT_P(0);
	BOX		   *b = (BOX *) palloc(sizeof(BOX));

	b->low = *p;
	b->high = *p;
	PG_RETURN_BOX_P(b);
}

/* The point a point's box stands for (support function 2, "fetch"). */
Datum
amrtree_point_fetch(PG_FUNCTION_ARGS)
{
	BOX		   *b = PG_GETARG_BOX_P(0);
	Point	   *p = (Point *) palloc(sizeof(Point));

	*p = b->low;
	PG_RETURN_POINT_P(p);
}

/*
 * A polygon's box: the bounding box PostgreSQL keeps inside the value.
 *
 * A polygon with a NaN coordinate (its bounding box then has one: the
 * maximum of make_bound_box takes NaN as the largest value) gets a box that
 * is NaN on every side, as an empty geometry does in amrtree_float4_bbox.
 * Its box with the NaN sides widened to infinity (amr_fbox_from_box) is no
 * bound of the distance: dist_ppoly() is 0 when point_inside() says the
 * point is inside, and point_inside() takes an edge to a vertex with a NaN
 * y for a crossing wherever the point's y is, so ((0,0),(1,NaN),(2,0)) <->
 * (-5,-100) is 0.  An ordered scan queued such a row under the gap to its
 * box, after rows that are farther away, and the executor failed with
 * "index returned tuples in wrong order".  All NaN, the key is never pruned
 * and its distance bound is 0; the operators are rechecked on the row as
 * for every polygon.
 */
Datum
amrtree_poly_bbox(PG_FUNCTION_ARGS)
{
	POLYGON    *poly = PG_GETARG_POLYGON_P(0);
	BOX		   *b = (BOX *) palloc(sizeof(BOX));

	*b = poly->boundbox;
	if (isnan(b->low.x) || isnan(b->low.y) || isnan(b->high.x) || isnan(b->high.y))
		b->low.x = b->low.y = b->high.x = b->high.y = get_float8_nan();
	PG_RETURN_BOX_P(b);
}

/*
 * A circle's box: centre +/- radius, the box GiST's circle_ops keeps (core's
 * box(circle) is the inscribed box, which is not a bound).  Unlike GiST's,
 * a sum beyond the float8 range is infinite rather than an error: the box
 * is a bound either way, and the planner computes it for every query
 * argument (amr_cost.c) -- an error there failed the query whatever plan
 * it would have chosen, sequential scans included.
 */
Datum
amrtree_circle_bbox(PG_FUNCTION_ARGS)
{
	CIRCLE	   *c = PG_GETARG_CIRCLE_P(0);
	BOX		   *b = (BOX *) palloc(sizeof(BOX));

	b->low.x = c->center.x - c->radius;
	b->low.y = c->center.y - c->radius;
	b->high.x = c->center.x + c->radius;
	b->high.y = c->center.y + c->radius;
	PG_RETURN_BOX_P(b);
}

/*
 * The float4 bounding box of a value of another extension's type, as that
 * type's own index operators see it, through SQL-callable functions found
 * in the type's schema (declared by amrtree_postgis as its support function
 * 1; the declared argument type, not the call site's, names T):
 *
 *	- postgis_getbbox(T), then box3d() of its result, then box() of that:
 *	  for PostGIS geometry, the float4 box cached in the value when it has
 *	  one, else the box computed from its coordinates -- what PostGIS's
 *	  operators compare (gserialized_datum_get_box2df_p).  The cached box is
 *	  not always the box of the coordinates: ST_QuantizeCoordinates() keeps
 *	  the box of the unquantized value, so POINT(3.299 1) && its result may
 *	  hold while the coordinates end at x = 3.296875.  A key taken from the
 *	  coordinates (box(geometry) recomputes) made index scans miss and add
 *	  rows that a sequential scan and PostGIS's GiST agree on.
 *	- box(T) returning box, the box of the coordinates (box(geometry)
 *	  computes it), which must exist: the key of a type without the chain
 *	  above, and for one with it the test that the operators' box covers the
 *	  coordinates (a value whose box does not gets the NaN key, below).
 *
 * The result is rounded outward to float4.  PostGIS's index operators
 * compare exactly those float4 boxes (its BOX2DF), so the key must be that
 * box, not the float8 one: two geometries whose float4 boxes touch while
 * their float8 boxes do not satisfy "&&".  A value without extent (NULL from
 * a function: an empty geometry), and one with a coordinate beyond float4's
 * range, gets a NaN box (below).
 */
static Oid
type_namespace(Oid typid)
{
	HeapTuple	tup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	Oid			nsp;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for type %u", typid);
	nsp = ((Form_pg_type) GETSTRUCT(tup))->typnamespace;
	ReleaseSysCache(tup);
	return nsp;
}

/* The function nsp.fname(argtype), or InvalidOid; *rettype its result type. */
static Oid
lookup_unary_function(const char *nsp, const char *fname, Oid argtype, Oid *rettype)
{
	List	   *name = list_make2(makeString(pstrdup(nsp)), makeString(pstrdup(fname)));
	Oid			fn = LookupFuncName(name, 1, &argtype, true);

	*rettype = OidIsValid(fn) ? get_func_rettype(fn) : InvalidOid;
	return fn;
}

/*
 * Round outward to float4 and clamp to its finite range, as PostGIS does
 * for its float4 boxes: an infinite or beyond-float coordinate becomes
 * +-FLT_MAX there, so POINT(Infinity 0) and POINT(3.5e38 0) have the same
 * box and are "@" each other.  NaN stays NaN.
 */
static double
float4_floor(double v)
{
	if (v > (double) FLT_MAX)
		return FLT_MAX;
	if (v <= -(double) FLT_MAX)
		return -FLT_MAX;
	return amr_round_down(v);
}

static double
float4_ceil(double v)
{
	if (v >= (double) FLT_MAX)
		return FLT_MAX;
	if (v < -(double) FLT_MAX)
		return -FLT_MAX;
	return amr_round_up(v);
}

#define FLOAT4_BBOX_CHAIN 3

typedef struct Float4BboxCache
{
	Oid			argtype;
	FmgrInfo	box_fn;			/* box(T): the box of the coordinates */
	int			nchain;			/* FLOAT4_BBOX_CHAIN, or 0 without it */
	FmgrInfo	chain[FLOAT4_BBOX_CHAIN];	/* postgis_getbbox, box3d, box */
} Float4BboxCache;

/* Apply fns[0..n-1] in turn to value; false if one returned NULL. */
static bool
apply_unary_functions(FmgrInfo *fns, int n, Oid collation, Datum value, BOX *out)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		LOCAL_FCINFO(inner, 1);

		InitFunctionCallInfoData(*inner, &fns[i], 1, collation, NULL, NULL);
		inner->args[0].value = value;
		inner->args[0].isnull = false;
		value = FunctionCallInvoke(inner);
		if (inner->isnull)
			return false;
	}
	*out = *DatumGetBoxP(value);
	return true;
}

static bool
box_has_nan(const BOX *b)
{
	return isnan(b->low.x) || isnan(b->low.y) || isnan(b->high.x) || isnan(b->high.y);
}

/* Has b a coordinate outside float4's finite range (no NaN in b)? */
static bool
box_beyond_float4(const BOX *b)
{
	return fabs(b->low.x) > FLT_MAX || fabs(b->low.y) > FLT_MAX ||
		fabs(b->high.x) > FLT_MAX || fabs(b->high.y) > FLT_MAX;
}

/* b rounded outward to float4, clamped to its range (no NaN in b) */
static void
box_round_float4(BOX *b)
{
	b->low.x = float4_floor(b->low.x);
	b->low.y = float4_floor(b->low.y);
	b->high.x = float4_ceil(b->high.x);
	b->high.y = float4_ceil(b->high.y);
}

Datum
amrtree_float4_bbox(PG_FUNCTION_ARGS)
{
	Float4BboxCache *cache = (Float4BboxCache *) fcinfo->flinfo->fn_extra;
	BOX		   *b = (BOX *) palloc(sizeof(BOX));
	BOX			coords;
	bool		have_box;

	if (cache == NULL)
	{
		Oid		   *argtypes;
		int			nargs;
		Oid			chain[FLOAT4_BBOX_CHAIN] = {InvalidOid, InvalidOid, InvalidOid};
		Oid			boxfn;
		Oid			rettype = InvalidOid;
		char	   *nsp;
		int			i;

		get_func_signature(fcinfo->flinfo->fn_oid, &argtypes, &nargs);
		if (nargs != 1)
			elog(ERROR, "amrtree_float4_bbox must be declared with one argument");
		nsp = get_namespace_name(type_namespace(argtypes[0]));
		boxfn = lookup_unary_function(nsp, "box", argtypes[0], &rettype);
		if (!OidIsValid(boxfn) || rettype != BOXOID)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_FUNCTION),
					 errmsg("type %s has no function box(%s) returning box in its schema",
							format_type_be(argtypes[0]), format_type_be(argtypes[0])),
					 errdetail("amrtree takes the bounding box of such values from that function.")));

		/* the operators' box: postgis_getbbox(T), box3d(), box() */
		chain[0] = lookup_unary_function(nsp, "postgis_getbbox", argtypes[0], &rettype);
		if (OidIsValid(chain[0]))
			chain[1] = lookup_unary_function(nsp, "box3d", rettype, &rettype);
		if (OidIsValid(chain[1]))
			chain[2] = lookup_unary_function(nsp, "box", rettype, &rettype);

		cache = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(Float4BboxCache));
		cache->argtype = argtypes[0];
		fmgr_info_cxt(boxfn, &cache->box_fn, fcinfo->flinfo->fn_mcxt);
		if (OidIsValid(chain[2]) && rettype == BOXOID)
		{
			cache->nchain = FLOAT4_BBOX_CHAIN;
			for (i = 0; i < FLOAT4_BBOX_CHAIN; i++)
				fmgr_info_cxt(chain[i], &cache->chain[i], fcinfo->flinfo->fn_mcxt);
		}
		fcinfo->flinfo->fn_extra = cache;
	}

	have_box = apply_unary_functions(&cache->box_fn, 1, PG_GET_COLLATION(),
									 PG_GETARG_DATUM(0), &coords);
	if (have_box && cache->nchain > 0)
		have_box = apply_unary_functions(cache->chain, cache->nchain, PG_GET_COLLATION(),
										 PG_GETARG_DATUM(0), b);
	else
		*b = coords;

	/*
	 * No box, a NaN coordinate, or one beyond float4's range: the value gets
	 * the key of an empty geometry -- all NaN, never pruned, distance bound
	 * 0, and decided by the operator itself.
	 *
	 * A NaN coordinate: PostGIS takes a float4 box whose xmin is NaN for an
	 * EMPTY one, and "@" holds for EMPTY within anything not EMPTY -- so
	 * POINT(NaN 5) @ any envelope, whatever its y.  The key's other sides
	 * would prune it (amr_fbox_from_box keeps them).  Any NaN, not only
	 * xmin's, so as not to depend on which side PostGIS looks at.
	 *
	 * A coordinate beyond float4's range (infinite, or finite past FLT_MAX):
	 * the key, clamped to FLT_MAX, still bounds the boxes the operators
	 * compare, but not the distance "<->" measures.  PostGIS's
	 * point-in-polygon test meets inf - inf on an edge to such a vertex and
	 * finds points far outside the polygon inside it: POLYGON((9e137 769,
	 * 9e137 Infinity, ...)) <-> POINT(311 861) is 0.  An ordered scan queued
	 * that row under the gap to its key (3.4e38), and a LIMIT cut it off: a
	 * row missing from the answer, not an error (PostGIS's GiST fails the
	 * same query with "index returned tuples in wrong order").
	 */
	if (!have_box || box_has_nan(b) || box_has_nan(&coords) ||
		box_beyond_float4(b) || box_beyond_float4(&coords))
	{
		b->low.x = b->low.y = b->high.x = b->high.y = get_float8_nan();
		PG_RETURN_BOX_P(b);
	}
	box_round_float4(b);

	/*
	 * A cached box that does not cover the coordinates (a stale one, see
	 * above) is what the operators compare, but it is no bound of the
	 * distance "<->" measures on the coordinates, nor of the coordinates' box
	 * either.  Such a value gets the NaN key too: every operator and distance
	 * is then decided on the row.  (PostGIS's GiST keeps the cached box and
	 * fails "ORDER BY g <-> q" with "index returned tuples in wrong order"
	 * when it meets such a row.)
	 */
	box_round_float4(&coords);
	if (coords.low.x < b->low.x || coords.low.y < b->low.y ||
		coords.high.x > b->high.x || coords.high.y > b->high.y)
		b->low.x = b->low.y = b->high.x = b->high.y = get_float8_nan();
	PG_RETURN_BOX_P(b);
}
