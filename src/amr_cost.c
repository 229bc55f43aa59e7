/*-------------------------------------------------------------------------
 *
 * amr_cost.c
 *		amcostestimate.
 *
 * PostgreSQL's box operators carry fixed selectivity estimators (areasel is
 * 0.5% whatever the window), so on its own the planner cannot tell a small
 * window from one covering the whole table.  amrtree's inner nodes live in
 * DRAM, so when the query box is a constant we ask the tree itself: the
 * number of leaves the scan would visit, out of all leaves, is a selectivity
 * measured on the actual data, at the price of a walk over the inner nodes
 * (microseconds).  Otherwise we fall back to genericcostestimate().
 *
 * Leaves are read from memory (PMEM), not through the buffer manager and the
 * disk, so a leaf costs a fraction of a page read; descending the DRAM inner
 * nodes is startup cost.  The planner adds the heap fetches from the
 * selectivity, which is what makes a sequential scan win for unselective
 * queries.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <math.h>

#include "access/relation.h"
#include "access/xlog.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "utils/geo_decls.h"
#include "utils/lsyscache.h"
#include "utils/selfuncs.h"
#include "utils/spccache.h"

/* typical entries per leaf once inserts have split packed leaves */
#define AMR_TYPICAL_LEAF_ENTRIES (AMR_LEAF_CAPACITY * 0.7)
/* cost of reading one leaf from PMEM, in units of seq_page_cost */
#define AMR_LEAF_READ_FACTOR 0.25

typedef struct TreeProbe
{
	double		selectivity;
	double		leaves_fetched;
	double		leaves;
	double		entries;
	int			nquals;
} TreeProbe;

/* Does this server hold a usable tree for the index? */
static bool
index_has_tree(Oid indexoid)
{
	Relation	irel = relation_open(indexoid, NoLock);
	AmrTree    *t = amr_tree_open_extended(irel, true);

	relation_close(irel, NoLock);
	return t != NULL;
}

/*
 * Measure the selectivity of the index quals on the tree, if every qual is
 * "indexed column <op> constant box".
 */
static bool
probe_tree(PlannerInfo *root, IndexOptInfo *index, IndexPath *path,
		   TreeProbe *probe)
{
	AmrScanKey	keys[16];
	Datum		consts[16];
	Oid			argtypes[16];
	int			strategies[16];
	int			nkeys = 0;
	ListCell   *lc;
	Relation	irel;
	AmrTree    *t;
	uint64		matched;

	if (!amr_is_ready())
		return false;

	foreach(lc, path->indexclauses)
	{
		IndexClause *ic = lfirst_node(IndexClause, lc);
		ListCell   *lc2;

		foreach(lc2, ic->indexquals)
		{
			RestrictInfo *ri = lfirst_node(RestrictInfo, lc2);
			OpExpr	   *op;
			Node	   *arg;
			int			strategy;
			Oid			lefttype;
			Oid			righttype;

			if (!IsA(ri->clause, OpExpr) || nkeys >= lengthof(keys))
				return false;
			op = (OpExpr *) ri->clause;
			if (list_length(op->args) != 2)
				return false;
			arg = estimate_expression_value(root, (Node *) lsecond(op->args));
			if (!IsA(arg, Const) || ((Const *) arg)->constisnull)
				return false;
			strategy = get_op_opfamily_strategy(op->opno, index->opfamily[0]);
			if (amr_strategy_relation(strategy) == 0)
				return false;
			op_input_types(op->opno, &lefttype, &righttype);
			consts[nkeys] = ((Const *) arg)->constvalue;
			argtypes[nkeys] = righttype;
			strategies[nkeys] = strategy;
			nkeys++;
		}
	}
	if (nkeys == 0)
		return false;

	irel = relation_open(index->indexoid, NoLock);
	t = amr_tree_open_extended(irel, true);
	if (t != NULL)
	{
		int			k;

		/* the query boxes, as a scan would compute them */
		for (k = 0; k < nkeys; k++)
			(void) amr_scankey_from_pg(irel, strategies[k], argtypes[k], consts[k],
									   NULL, NULL, &keys[k]);
	}
	relation_close(irel, NoLock);
	if (t == NULL)
		return false;

	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	matched = amr_count_leaves(&amr_store, t, keys, nkeys);
	probe->leaves = (double) amr_counter_read(&t->nleaves);
	probe->entries = (double) amr_counter_read(&t->nentries);
	LWLockRelease(amr_tree_lock(t));

	if (probe->leaves < 1 || probe->entries < 1)
		return false;
	probe->leaves_fetched = (double) matched;
	probe->selectivity = Max((double) matched / probe->leaves, 1.0 / probe->entries);
	probe->selectivity = Min(probe->selectivity, 1.0);
	probe->nquals = nkeys;
	return true;
}

void
amrcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
				Cost *indexStartupCost, Cost *indexTotalCost,
				Selectivity *indexSelectivity, double *indexCorrelation,
				double *indexPages)
{
	IndexOptInfo *index = path->indexinfo;
	TreeProbe	probe;
	double		tuples;
	double		leaves_fetched;
	double		height;
	double		seq_page_cost;
	double		qual_op_cost;
	Selectivity sel;

	if (probe_tree(root, index, path, &probe))
	{
		sel = probe.selectivity;
		tuples = sel * probe.entries;
		leaves_fetched = probe.leaves_fetched;
		height = Max(1.0, ceil(log(probe.leaves) / log(AMR_INNER_FANOUT)));
		qual_op_cost = cpu_operator_cost * probe.nquals;
	}
	else
	{
		GenericCosts costs;
		double		leaves;

		MemSet(&costs, 0, sizeof(costs));
		genericcostestimate(root, path, loop_count, &costs);
		sel = costs.indexSelectivity;
		tuples = costs.numIndexTuples;
		leaves = Max(1.0, ceil(index->tuples / AMR_TYPICAL_LEAF_ENTRIES));
		/* neighbouring leaves overlap: a window touches some beyond its share */
		leaves_fetched = Min(leaves, ceil(sel * leaves) + 1.0);
		height = Max(1.0, ceil(log(leaves) / log(AMR_INNER_FANOUT)));
		qual_op_cost = cpu_operator_cost * list_length(path->indexclauses);
	}

	get_tablespace_page_costs(index->reltablespace, NULL, &seq_page_cost);
	*indexStartupCost = height * AMR_INNER_FANOUT * cpu_operator_cost;
	*indexTotalCost = *indexStartupCost
		+ leaves_fetched * AMR_LEAF_READ_FACTOR * seq_page_cost
		+ leaves_fetched * AMR_LEAF_CAPACITY * qual_op_cost
		+ tuples * cpu_index_tuple_cost;
	*indexSelectivity = sel;
	*indexCorrelation = 0.0;
	*indexPages = leaves_fetched;

	/*
	 * Where the index cannot be used (not preloaded, the pool unusable, no
	 * tree on this server: a standby whose pool was not copied, a tree replay
	 * could not follow), steer the planner away from it, so that queries keep
	 * working; a scan that still happens raises the error.
	 */
	if (!amr_is_ready() || !index_has_tree(index->indexoid))
	{
		*indexStartupCost += disable_cost;
		*indexTotalCost += disable_cost;
	}
}
