/*-------------------------------------------------------------------------
 *
 * amr_cost.c
 *		amcostestimate.
 *
 * genericcostestimate() supplies the selectivity and the per-tuple CPU
 * costs, but it charges index pages from the size of the index relation,
 * which for amrtree is only the metapage.  We replace that part with the
 * leaves the scan will visit: the tree's leaf count (or, at plan time before
 * any use, reltuples over the typical fill) times the selectivity, each leaf
 * costing a fraction of a page read because leaves are read from memory
 * (PMEM) rather than through the buffer manager and the disk.  Descending
 * the DRAM inner nodes is startup cost.  The heap fetches are costed by the
 * planner itself from the selectivity, which is what makes a sequential
 * scan win for unselective queries.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <math.h>

#include "access/xlog.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "utils/selfuncs.h"
#include "utils/spccache.h"

/* typical entries per leaf once inserts have split packed leaves */
#define AMR_TYPICAL_LEAF_ENTRIES (AMR_LEAF_CAPACITY * 0.7)
/* cost of reading one leaf from PMEM, in units of seq_page_cost */
#define AMR_LEAF_READ_FACTOR 0.25

void
amrcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
				Cost *indexStartupCost, Cost *indexTotalCost,
				Selectivity *indexSelectivity, double *indexCorrelation,
				double *indexPages)
{
	IndexOptInfo *index = path->indexinfo;
	GenericCosts costs;
	double		leaves;
	double		leaves_fetched;
	double		height;
	double		seq_page_cost;

	MemSet(&costs, 0, sizeof(costs));
	genericcostestimate(root, path, loop_count, &costs);

	leaves = Max(1.0, ceil(index->tuples / AMR_TYPICAL_LEAF_ENTRIES));
	height = Max(1.0, ceil(log(leaves) / log(AMR_INNER_FANOUT)));
	/* neighbouring leaves overlap: a window touches some beyond its share */
	leaves_fetched = Min(leaves, ceil(costs.indexSelectivity * leaves) + 1.0);
	get_tablespace_page_costs(index->reltablespace, NULL, &seq_page_cost);

	*indexStartupCost = height * AMR_INNER_FANOUT * cpu_operator_cost;
	*indexTotalCost = Max(costs.indexTotalCost -
						  costs.numIndexPages * costs.spc_random_page_cost, 0.0)
		+ *indexStartupCost
		+ leaves_fetched * AMR_LEAF_READ_FACTOR * seq_page_cost;
	*indexSelectivity = costs.indexSelectivity;
	*indexCorrelation = 0.0;
	*indexPages = leaves_fetched;

	/*
	 * Where the index cannot be used (not preloaded, a hot standby), steer
	 * the planner away from it; a scan that still happens raises the error.
	 */
	if (!amr_preloaded || RecoveryInProgress())
	{
		*indexStartupCost += disable_cost;
		*indexTotalCost += disable_cost;
	}
}
