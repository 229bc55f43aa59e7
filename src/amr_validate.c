/*-------------------------------------------------------------------------
 *
 * amr_validate.c
 *		amvalidate: check an operator class definition.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "access/amvalidate.h"
#include "access/htup_details.h"
#include "catalog/pg_amop.h"
#include "catalog/pg_amproc.h"
#include "catalog/pg_opclass.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

/*
 * Search operators take strategies 1-12 (the box relations) or GiST's
 * point_ops numbers 28-30, 48 and 68, and return bool.  Support function 1
 * maps a type to its bounding box (T -> box, registered for (T, T)): the
 * indexed type unless it is box, and every right-hand type of a search
 * operator other than box and the indexed type.  The ordering operator, if
 * any, is strategy 15 (or PostGIS's 13 and 14): a distance from the indexed
 * value to a point or to a value that support function 1 maps, returning
 * float8, ordered by a btree family (float_ops).  Support function 2
 * (box -> T) and 3 ((box, box) -> float8, the distance bound of keys that
 * are not planar) are optional, registered for the indexed type.
 */

/* Whether the family has support function 1 for type typid. */
static bool
family_has_bbox(CatCList *proclist, Oid typid)
{
	int			i;

	for (i = 0; i < proclist->n_members; i++)
	{
		Form_pg_amproc procform = (Form_pg_amproc) GETSTRUCT(&proclist->members[i]->tuple);

		if (procform->amprocnum == AMR_BBOX_PROC &&
			procform->amproclefttype == typid && procform->amprocrighttype == typid)
			return true;
	}
	return false;
}

bool
amrvalidate(Oid opclassoid)
{
	bool		result = true;
	HeapTuple	classtup;
	Form_pg_opclass classform;
	Oid			opfamilyoid;
	Oid			opcintype;
	char	   *opclassname;
	HeapTuple	familytup;
	Form_pg_opfamily familyform;
	char	   *opfamilyname;
	CatCList   *proclist,
			   *oprlist;
	int			i;
	bool		have_overlap = false;

	classtup = SearchSysCache1(CLAOID, ObjectIdGetDatum(opclassoid));
	if (!HeapTupleIsValid(classtup))
		elog(ERROR, "cache lookup failed for operator class %u", opclassoid);
	classform = (Form_pg_opclass) GETSTRUCT(classtup);
	opfamilyoid = classform->opcfamily;
	opcintype = classform->opcintype;
	opclassname = NameStr(classform->opcname);

	familytup = SearchSysCache1(OPFAMILYOID, ObjectIdGetDatum(opfamilyoid));
	if (!HeapTupleIsValid(familytup))
		elog(ERROR, "cache lookup failed for operator family %u", opfamilyoid);
	familyform = (Form_pg_opfamily) GETSTRUCT(familytup);
	opfamilyname = NameStr(familyform->opfname);

	oprlist = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(opfamilyoid));
	proclist = SearchSysCacheList1(AMPROCNUM, ObjectIdGetDatum(opfamilyoid));

	for (i = 0; i < proclist->n_members; i++)
	{
		HeapTuple	proctup = &proclist->members[i]->tuple;
		Form_pg_amproc procform = (Form_pg_amproc) GETSTRUCT(proctup);
		bool		ok;

		switch (procform->amprocnum)
		{
			case AMR_BBOX_PROC:
				/* T -> box, for the indexed type and any query type */
				ok = procform->amproclefttype == procform->amprocrighttype &&
					check_amproc_signature(procform->amproc, BOXOID, true, 1, 1,
										   procform->amproclefttype);
				break;
			case AMR_FETCH_PROC:
				/* box -> T, for the indexed type */
				ok = procform->amproclefttype == opcintype &&
					procform->amprocrighttype == opcintype &&
					check_amproc_signature(procform->amproc, opcintype, true, 1, 1,
										   BOXOID);
				break;
			case AMR_DISTANCE_PROC:
				/* (box, box) -> float8, for the indexed type */
				ok = procform->amproclefttype == opcintype &&
					procform->amprocrighttype == opcintype &&
					check_amproc_signature(procform->amproc, FLOAT8OID, true, 2, 2,
										   BOXOID, BOXOID);
				break;
			default:
				ereport(INFO,
						(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
						 errmsg("operator family \"%s\" of access method %s contains function %s with invalid support number %d",
								opfamilyname, "amrtree",
								format_procedure(procform->amproc),
								procform->amprocnum)));
				result = false;
				continue;
		}
		if (!ok)
		{
			ereport(INFO,
					(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
					 errmsg("operator family \"%s\" of access method %s contains function %s with wrong signature for support number %d",
							opfamilyname, "amrtree",
							format_procedure(procform->amproc),
							procform->amprocnum)));
			result = false;
		}
	}

	for (i = 0; i < oprlist->n_members; i++)
	{
		HeapTuple	oprtup = &oprlist->members[i]->tuple;
		Form_pg_amop oprform = (Form_pg_amop) GETSTRUCT(oprtup);

		if (oprform->amoppurpose == AMOP_SEARCH)
		{
			if (amr_strategy_relation(oprform->amopstrategy) == 0)
			{
				ereport(INFO,
						(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
						 errmsg("operator family \"%s\" of access method %s contains operator %s with invalid strategy number %d",
								opfamilyname, "amrtree",
								format_operator(oprform->amopopr),
								oprform->amopstrategy)));
				result = false;
				continue;
			}
			if (OidIsValid(oprform->amopsortfamily) ||
				!check_amop_signature(oprform->amopopr, BOOLOID,
									  oprform->amoplefttype,
									  oprform->amoprighttype))
			{
				ereport(INFO,
						(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
						 errmsg("operator family \"%s\" of access method %s contains operator %s with wrong signature",
								opfamilyname, "amrtree",
								format_operator(oprform->amopopr))));
				result = false;
			}
			else if (oprform->amoprighttype != BOXOID &&
					 !family_has_bbox(proclist, oprform->amoprighttype))
			{
				ereport(INFO,
						(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
						 errmsg("operator family \"%s\" of access method %s contains operator %s, but no support function 1 for type %s",
								opfamilyname, "amrtree",
								format_operator(oprform->amopopr),
								format_type_be(oprform->amoprighttype))));
				result = false;
			}
			if (oprform->amopstrategy == AMR_STRAT_OVERLAP)
				have_overlap = true;
		}
		else
		{
			if (!amr_is_ordering_strategy(oprform->amopstrategy) ||
				!OidIsValid(oprform->amopsortfamily) ||
				(oprform->amoprighttype != POINTOID && oprform->amoprighttype != BOXOID &&
				 !family_has_bbox(proclist, oprform->amoprighttype)) ||
				!check_amop_signature(oprform->amopopr, FLOAT8OID,
									  oprform->amoplefttype,
									  oprform->amoprighttype))
			{
				ereport(INFO,
						(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
						 errmsg("operator family \"%s\" of access method %s contains ordering operator %s with wrong strategy number or signature",
								opfamilyname, "amrtree",
								format_operator(oprform->amopopr)),
						 errdetail("amrtree orders by strategies 13 to 15: a distance from the indexed value to a point or to a value with support function 1, returning double precision.")));
				result = false;
			}
		}
	}

	if (opcintype == BOXOID && !have_overlap)
	{
		ereport(INFO,
				(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
				 errmsg("operator class \"%s\" of access method %s is missing the overlap operator (strategy %d)",
						opclassname, "amrtree", AMR_STRAT_OVERLAP)));
		result = false;
	}

	/* the indexed type must be box, unless support function 1 maps it */
	if (opcintype != BOXOID && !family_has_bbox(proclist, opcintype))
	{
		ereport(INFO,
				(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
				 errmsg("operator class \"%s\" of access method %s indexes type %s but has no support function 1 to map it to box",
						opclassname, "amrtree", format_type_be(opcintype))));
		result = false;
	}

	ReleaseCatCacheList(proclist);
	ReleaseCatCacheList(oprlist);
	ReleaseSysCache(familytup);
	ReleaseSysCache(classtup);

	return result;
}

/*
 * amproperty: answer "distance_orderable" for a key column, which core
 * leaves to the access method (NULL otherwise).  A column is distance
 * orderable when its operator family has an ordering operator whose left
 * type is the column's operator-class input type, which is exactly when
 * the planner can use the index for ORDER BY col <-> value.  Every other
 * property is core's generic answer (amcanreturn, amsearchnulls, ...).
 */
bool
amrproperty(Oid index_oid, int attno, IndexAMProperty prop, const char *propname,
			bool *res, bool *isnull)
{
	Oid			opclass;
	Oid			opfamily;
	Oid			opcintype;
	CatCList   *oprlist;
	int			i;

	if (attno == 0 || prop != AMPROP_DISTANCE_ORDERABLE)
		return false;

	/* INCLUDE columns and unknown columns have no operator class */
	opclass = get_index_column_opclass(index_oid, attno);
	if (!OidIsValid(opclass) ||
		!get_opclass_opfamily_and_input_type(opclass, &opfamily, &opcintype))
	{
		*isnull = true;
		return true;
	}

	*res = false;
	oprlist = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(opfamily));
	for (i = 0; i < oprlist->n_members && !*res; i++)
	{
		Form_pg_amop oprform = (Form_pg_amop) GETSTRUCT(&oprlist->members[i]->tuple);

		*res = oprform->amoppurpose == AMOP_ORDER && oprform->amoplefttype == opcintype;
	}
	ReleaseSysCacheList(oprlist);
	return true;
}
