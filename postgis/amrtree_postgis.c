/*-------------------------------------------------------------------------
 *
 * amrtree_postgis.c
 *		Support function 1 of amrtree's operator class for PostGIS geometry:
 *		the bounding box that PostGIS's own 2-D index operators compare.
 *
 * PostGIS's 2-D operators (&&, ~, @, <<, &<, ...) do not compare a
 * geometry's exact double-precision bounding box.  They compare a float4
 * box rounded outward (each minimum down to the nearest float at or below
 * it, each maximum up to the nearest float at or above it, and clamped to
 * the float range), the box PostGIS caches inside a serialized geometry.
 * Two geometries whose exact boxes are disjoint may therefore "overlap" for
 * &&, and where float4 steps are coarse (0.0625 at 1e6: web-mercator
 * metres) they may be centimetres apart.  amrtree's filter for a lossy
 * operator class is only sound as a necessary condition of the operator, so
 * the key it stores must be that same float4 box (held exactly in a float8
 * box); with the exact box, such rows would be missed.
 *
 * The box is obtained through PostGIS's SQL-callable functions, never its
 * internal structures or headers:
 *
 *	postgis_getbbox(geometry) -> box2d	the box cached in the value, or the
 *										box computed from it when it carries
 *										none (points); NULL when empty.  It
 *										does not deserialize the geometry.
 *	box3d(box2d) -> box3d, box(box3d) -> box
 *										into a core box, field by field.
 *
 * (box(geometry) would be one call, but it deserializes the geometry to
 * compute the box: 2.3 times slower on 200-vertex polygons, and it returns
 * the float8 box, infinities included, where the operators compare clamped
 * float4 ones.)
 *
 * Rounding the result outward again (float_min_bound, float_max_bound) is
 * idempotent for a float4 box, which is what PostGIS 3.3 returns for every
 * geometry, and gives PostGIS's own float4 box where a version returns the
 * float8 box of a value that carries none (a point), so the key is the box
 * PostGIS's operators compare in every case.  An empty geometry has no
 * box: support function 1 then returns a box of NaNs, which amrtree hands to
 * the recheck unconditionally.
 *
 * The three functions are looked up once per calling FmgrInfo (cached in
 * fn_extra) in the schema of our own argument type, geometry, so that the
 * lookup depends neither on search_path nor on PostGIS's schema name.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <float.h>
#include <math.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/geo_decls.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

PG_MODULE_MAGIC;

/* PostGIS's functions that make a core box of a geometry's float4 box */
typedef struct GeomBboxFns
{
	FmgrInfo	getbbox;		/* postgis_getbbox(geometry) -> box2d */
	FmgrInfo	to_box3d;		/* box3d(box2d) -> box3d */
	FmgrInfo	to_box;			/* box(box3d) -> box */
	MemoryContext work_cxt;		/* what the three calls allocate, per call */
} GeomBboxFns;

/*
 * The function nspname.name(argtype); its return type in *rettype.  An ERROR
 * if PostGIS does not have it: without it no box can be computed.
 */
static Oid
lookup_postgis_function(const char *nspname, const char *name, Oid argtype,
						Oid *rettype)
{
	List	   *qname;
	Oid			fn;

	qname = list_make2(makeString(pstrdup(nspname)), makeString(pstrdup(name)));
	fn = LookupFuncName(qname, 1, &argtype, true);
	if (!OidIsValid(fn))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function %s.%s(%s) does not exist",
						quote_identifier(nspname), quote_identifier(name),
						format_type_be(argtype)),
				 errdetail("amrtree_postgis computes a geometry's bounding box with PostGIS's postgis_getbbox(geometry), box3d(box2d) and box(box3d)."),
				 errhint("Install PostGIS 3, with all its functions in the schema of type geometry.")));
	*rettype = get_func_rettype(fn);
	list_free_deep(qname);
	return fn;
}

/*
 * Look up PostGIS's functions for the geometry type that function fn_oid
 * (our support function) takes, and fill fns in memory context cxt.
 */
static void
init_bbox_fns(Oid fn_oid, GeomBboxFns *fns, MemoryContext cxt)
{
	Oid		   *argtypes;
	int			nargs;
	HeapTuple	typtup;
	char	   *nspname;
	Oid			box2d_type,
				box3d_type,
				box_type;
	Oid			getbbox,
				to_box3d,
				to_box;

	(void) get_func_signature(fn_oid, &argtypes, &nargs);
	if (nargs != 1)
		elog(ERROR, "function %u is not a one-argument bounding-box function", fn_oid);

	/* PostGIS keeps its types and functions in one schema */
	typtup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(argtypes[0]));
	if (!HeapTupleIsValid(typtup))
		elog(ERROR, "cache lookup failed for type %u", argtypes[0]);
	nspname = get_namespace_name(((Form_pg_type) GETSTRUCT(typtup))->typnamespace);
	ReleaseSysCache(typtup);
	if (nspname == NULL)
		elog(ERROR, "cache lookup failed for the schema of type %u", argtypes[0]);

	getbbox = lookup_postgis_function(nspname, "postgis_getbbox", argtypes[0], &box2d_type);
	to_box3d = lookup_postgis_function(nspname, "box3d", box2d_type, &box3d_type);
	to_box = lookup_postgis_function(nspname, "box", box3d_type, &box_type);
	if (box_type != BOXOID)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("function %s does not return type box", format_procedure(to_box))));

	fmgr_info_cxt(getbbox, &fns->getbbox, cxt);
	fmgr_info_cxt(to_box3d, &fns->to_box3d, cxt);
	fmgr_info_cxt(to_box, &fns->to_box, cxt);
	fns->work_cxt = AllocSetContextCreate(cxt, "amrtree_postgis bbox",
										  ALLOCSET_SMALL_SIZES);
	pfree(argtypes);
	pfree(nspname);
}

/*
 * The float4 rounding of PostGIS's boxes (its float4 box of a float8 one):
 * a minimum becomes the largest float at or below it, a maximum the
 * smallest float at or above it, and anything beyond the float range,
 * infinities included, becomes -FLT_MAX or FLT_MAX (PostGIS 3 clamps so).
 * NaN stays NaN.  The comparisons are written out because converting a
 * double beyond FLT_MAX to float is undefined in C.
 */
static float
float_min_bound(double d)
{
	float		f;

	if (isnan(d))
		return (float) d;
	if (d > FLT_MAX)
		return FLT_MAX;
	if (d <= -FLT_MAX)
		return -FLT_MAX;
	f = (float) d;
	if ((double) f > d)
		f = nextafterf(f, -FLT_MAX);
	return f;
}

/* The maximum's counterpart of float_min_bound. */
static float
float_max_bound(double d)
{
	return -float_min_bound(-d);
}

/*
 * Support function 1 of amrtree_postgis.geometry_ops_2d: the float4 box,
 * rounded outward, that PostGIS's 2-D operators compare, as a core box; a
 * box of NaNs for an empty geometry.
 */
PG_FUNCTION_INFO_V1(amrtree_postgis_bbox);

Datum
amrtree_postgis_bbox(PG_FUNCTION_ARGS)
{
	GeomBboxFns *fns = (GeomBboxFns *) fcinfo->flinfo->fn_extra;
	LOCAL_FCINFO(getbbox_fcinfo, 1);
	MemoryContext old_cxt;
	Datum		box2d;
	bool		empty;
	BOX		   *pgbox = NULL;
	BOX		   *result;

	if (fns == NULL)
	{
		fns = MemoryContextAlloc(fcinfo->flinfo->fn_mcxt, sizeof(GeomBboxFns));
		init_bbox_fns(fcinfo->flinfo->fn_oid, fns, fcinfo->flinfo->fn_mcxt);
		fcinfo->flinfo->fn_extra = fns;
	}

	/*
	 * PostGIS's calls allocate in a context of our own, reset after every
	 * call: an index build calls this once per row in a long-lived context,
	 * and postgis_getbbox may detoast a large geometry.  (Reset before, too,
	 * in case the previous call ended in an error.)
	 */
	MemoryContextReset(fns->work_cxt);
	old_cxt = MemoryContextSwitchTo(fns->work_cxt);

	/* called by hand: postgis_getbbox returns NULL for an empty geometry */
	InitFunctionCallInfoData(*getbbox_fcinfo, &fns->getbbox, 1, InvalidOid, NULL, NULL);
	getbbox_fcinfo->args[0].value = PG_GETARG_DATUM(0);
	getbbox_fcinfo->args[0].isnull = false;
	box2d = FunctionCallInvoke(getbbox_fcinfo);
	empty = getbbox_fcinfo->isnull;
	if (!empty)
		pgbox = DatumGetBoxP(FunctionCall1(&fns->to_box,
										   FunctionCall1(&fns->to_box3d, box2d)));

	MemoryContextSwitchTo(old_cxt);
	result = (BOX *) palloc(sizeof(BOX));
	if (empty)
	{
		result->low.x = result->low.y = get_float8_nan();
		result->high.x = result->high.y = get_float8_nan();
	}
	else
	{
		/* box(box3d) puts the minima in low and the maxima in high */
		result->low.x = float_min_bound(pgbox->low.x);
		result->low.y = float_min_bound(pgbox->low.y);
		result->high.x = float_max_bound(pgbox->high.x);
		result->high.y = float_max_bound(pgbox->high.y);
	}
	MemoryContextReset(fns->work_cxt);
	PG_RETURN_BOX_P(result);
}
