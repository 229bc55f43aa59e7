/*-------------------------------------------------------------------------
 *
 * amr_plan.c
 *		Index conditions that functions' planner support gives only to GiST.
 *
 * A function can let the planner use an index for it: its support function,
 * asked with the index column's operator family, returns an index condition
 * the function implies (SupportRequestIndexCondition).  PostGIS does this for
 * ST_Intersects, ST_DWithin, ST_Contains and the rest (ST_Intersects(g, q)
 * implies g && q; ST_DWithin(g, q, r) implies g && ST_Expand(q, r)), but only
 * when the family belongs to GiST, SP-GiST or BRIN.  Asked with amrtree's
 * family it answers nothing, and a query a GiST index served became a
 * sequential scan once the index was created USING amrtree.
 *
 * An amrtree operator family whose operators are exactly those of its type's
 * default GiST operator class -- the same operators under the same strategy
 * numbers, for the same types, with the same orderings -- has that GiST
 * family as its *twin*: a condition built from the twin is made of operators
 * the amrtree family has under the same numbers, which the amrtree index
 * answers exactly as it answers them written by hand.  The geometry_ops_2d
 * of amrtree_postgis is the twin of PostGIS's gist_geometry_ops_2d.
 *
 * So after the core planner has made a relation's paths
 * (set_rel_pathlist_hook), if the relation has an amrtree index with a twin
 * and one of its restriction or join clauses calls a function that has a
 * support function (alone, or in an arm of an OR), the index paths are made
 * again with each such index listed under its twin's families (a copy of
 * its IndexOptInfo), and add_path keeps what is cheaper.  The support
 * function then sees the GiST family, and the paths -- plain, bitmap,
 * index-only, parameterized for nested loops -- and their costs are those
 * a GiST index gets.  The copies live only in those paths: after path
 * generation nothing reads an index path's families, and the executor takes
 * the families from the index relation itself, where an operator outside
 * amrtree's family would be an error, never a wrong row.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "access/htup_details.h"
#include "catalog/pg_am.h"
#include "catalog/pg_amop.h"
#include "catalog/pg_class.h"
#include "commands/defrem.h"
#include "nodes/pathnodes.h"
#include "optimizer/paths.h"
#include "utils/catcache.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

static set_rel_pathlist_hook_type prev_set_rel_pathlist_hook = NULL;

/* An amrtree family, for one input type, and its GiST twin. */
typedef struct AmrTwinKey
{
	Oid			family;
	Oid			intype;
} AmrTwinKey;

typedef struct AmrTwinEntry
{
	AmrTwinKey	key;
	Oid			twin;			/* InvalidOid: none */
} AmrTwinEntry;

/* Backend-local; emptied when operator classes or families change. */
static HTAB *twin_cache = NULL;

static void
twin_cache_reset(Datum arg, int cacheid, uint32 hashvalue)
{
	if (twin_cache != NULL)
	{
		hash_destroy(twin_cache);
		twin_cache = NULL;
	}
}

static void
twin_cache_ensure(void)
{
	static bool callbacks_registered = false;
	HASHCTL		ctl;

	if (twin_cache != NULL)
		return;
	if (!callbacks_registered)
	{
		CacheRegisterSyscacheCallback(AMOPSTRATEGY, twin_cache_reset, (Datum) 0);
		CacheRegisterSyscacheCallback(CLAOID, twin_cache_reset, (Datum) 0);
		callbacks_registered = true;
	}
	ctl.keysize = sizeof(AmrTwinKey);
	ctl.entrysize = sizeof(AmrTwinEntry);
	ctl.hcxt = CacheMemoryContext;
	twin_cache = hash_create("amrtree GiST twins", 16, &ctl,
							 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/* Do the two families have the same pg_amop rows, apart from the family? */
static bool
same_operators(Oid family_a, Oid family_b)
{
	CatCList   *a = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(family_a));
	CatCList   *b = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(family_b));
	bool		same = a->n_members > 0 && a->n_members == b->n_members;
	int			i;

	/*
	 * pg_amop is unique on (family, lefttype, righttype, strategy), so equal
	 * counts and every row of a found in b make the sets equal.
	 */
	for (i = 0; same && i < a->n_members; i++)
	{
		Form_pg_amop x = (Form_pg_amop) GETSTRUCT(&a->members[i]->tuple);
		int			j;

		same = false;
		for (j = 0; !same && j < b->n_members; j++)
		{
			Form_pg_amop y = (Form_pg_amop) GETSTRUCT(&b->members[j]->tuple);

			same = x->amopstrategy == y->amopstrategy &&
				x->amoplefttype == y->amoplefttype &&
				x->amoprighttype == y->amoprighttype &&
				x->amoppurpose == y->amoppurpose &&
				x->amopopr == y->amopopr &&
				x->amopsortfamily == y->amopsortfamily;
		}
	}
	ReleaseSysCacheList(a);
	ReleaseSysCacheList(b);
	return same;
}

/* The GiST twin of an amrtree family for an input type, or InvalidOid. */
static Oid
gist_twin(Oid family, Oid intype)
{
	AmrTwinKey	key;
	AmrTwinEntry *entry;

	memset(&key, 0, sizeof(key));
	key.family = family;
	key.intype = intype;
	twin_cache_ensure();
	entry = hash_search(twin_cache, &key, HASH_FIND, NULL);
	if (entry == NULL)
	{
		Oid			opclass = GetDefaultOpClass(intype, GIST_AM_OID);
		Oid			twin = InvalidOid;

		if (OidIsValid(opclass))
		{
			Oid			gist_family = get_opclass_family(opclass);

			if (same_operators(family, gist_family))
				twin = gist_family;
		}
		/* entered only now: the lookups above may have reset the cache */
		twin_cache_ensure();
		entry = hash_search(twin_cache, &key, HASH_ENTER, NULL);
		entry->twin = twin;
	}
	return entry->twin;
}

/*
 * A copy of an amrtree index's IndexOptInfo that lists its columns under
 * their GiST twins, or NULL when no column has one.
 */
static IndexOptInfo *
index_as_twin(IndexOptInfo *index)
{
	IndexOptInfo *copy = NULL;
	int			col;

	if (index->amcostestimate != amrcostestimate)
		return NULL;
	for (col = 0; col < index->nkeycolumns; col++)
	{
		Oid			twin = gist_twin(index->opfamily[col], index->opcintype[col]);

		if (!OidIsValid(twin))
			continue;
		if (copy == NULL)
		{
			copy = palloc(sizeof(IndexOptInfo));
			memcpy(copy, index, sizeof(IndexOptInfo));
			copy->opfamily = palloc(sizeof(Oid) * index->nkeycolumns);
			memcpy(copy->opfamily, index->opfamily, sizeof(Oid) * index->nkeycolumns);
		}
		copy->opfamily[col] = twin;
	}
	return copy;
}

/*
 * Does the clause call a function that has planner support, alone or as an
 * arm of an OR (bitmap OR paths) or of an AND inside one?  Only calls: an
 * operator in a clause is matched against the index's family itself, and
 * PostGIS answers for function calls alone.
 */
static bool
clause_has_support(Node *clause)
{
	ListCell   *lc;

	if (IsA(clause, FuncExpr))
		return OidIsValid(get_func_support(((FuncExpr *) clause)->funcid));
	if (!IsA(clause, BoolExpr) || ((BoolExpr *) clause)->boolop == NOT_EXPR)
		return false;
	foreach(lc, ((BoolExpr *) clause)->args)
	{
		if (clause_has_support((Node *) lfirst(lc)))
			return true;
	}
	return false;
}

/* Does any of a list of RestrictInfos call such a function? */
static bool
any_clause_has_support(List *rinfos)
{
	ListCell   *lc;

	foreach(lc, rinfos)
	{
		if (clause_has_support((Node *) lfirst_node(RestrictInfo, lc)->clause))
			return true;
	}
	return false;
}

static bool
rel_has_amrtree_index(RelOptInfo *rel)
{
	ListCell   *lc;

	foreach(lc, rel->indexlist)
	{
		if (lfirst_node(IndexOptInfo, lc)->amcostestimate == amrcostestimate)
			return true;
	}
	return false;
}

/*
 * Add the index paths a relation gets when its amrtree indexes are listed
 * under their GiST twins (see the file header).
 */
static void
amr_set_rel_pathlist(PlannerInfo *root, RelOptInfo *rel, Index rti,
					 RangeTblEntry *rte)
{
	List	   *as_twins = NIL;
	List	   *indexes;
	bool		any_twin = false;
	ListCell   *lc;

	if (prev_set_rel_pathlist_hook)
		prev_set_rel_pathlist_hook(root, rel, rti, rte);

	/*
	 * Only where the core planner made index paths (set_plain_rel_pathlist),
	 * and cheapest tests first: every query's relations pass here.
	 */
	if (rel->rtekind != RTE_RELATION || rte->inh || rte->tablesample != NULL ||
		rte->relkind == RELKIND_FOREIGN_TABLE || IS_DUMMY_REL(rel) ||
		!rel_has_amrtree_index(rel) ||
		!(any_clause_has_support(rel->baserestrictinfo) ||
		  any_clause_has_support(rel->joininfo)))
		return;

	foreach(lc, rel->indexlist)
	{
		IndexOptInfo *index = lfirst_node(IndexOptInfo, lc);
		IndexOptInfo *twin = index_as_twin(index);

		as_twins = lappend(as_twins, twin != NULL ? twin : index);
		any_twin |= twin != NULL;
	}
	if (!any_twin)
		return;

	/*
	 * All the relation's indexes, so that bitmap paths can combine an amrtree
	 * index with the others as they would a GiST one; paths equal to those
	 * already made are dropped by add_path.
	 */
	indexes = rel->indexlist;
	rel->indexlist = as_twins;
	create_index_paths(root, rel);
	rel->indexlist = indexes;
}

/* Install the planner hook (_PG_init). */
void
amr_plan_register_hooks(void)
{
	prev_set_rel_pathlist_hook = set_rel_pathlist_hook;
	set_rel_pathlist_hook = amr_set_rel_pathlist;
}
