/*-------------------------------------------------------------------------
 *
 * amr_policy.c
 *		Hotness, rules and budget planning (see amr_policy.h).
 *
 *-------------------------------------------------------------------------
 */
#include "amr_policy.h"

#include <math.h>
#include <stdlib.h>

void
amr_hotness_fold(AmrLeafVolatile *v, double now, double lambda)
{
	uint32_t	reads = __atomic_exchange_n(&v->reads_pending, 0, __ATOMIC_RELAXED);
	uint32_t	writes = __atomic_exchange_n(&v->writes_pending, 0, __ATOMIC_RELAXED);
	uint32_t	splits = __atomic_exchange_n(&v->splits_pending, 0, __ATOMIC_RELAXED);
	double		decay = 1.0;

	if (v->last_fold > 0 && now > v->last_fold)
		decay = exp(-lambda * (now - v->last_fold));
	v->hotness = (float) (v->hotness * decay + reads + writes);
	v->update_hot = (float) (v->update_hot * decay + writes);
	v->smo_hot = (float) (v->smo_hot * decay + splits);
	v->last_fold = now;
}

double
amr_hotness_now(const AmrLeafVolatile *v, double now, double lambda)
{
	double		decay = 1.0;

	if (v->last_fold > 0 && now > v->last_fold)
		decay = exp(-lambda * (now - v->last_fold));
	return v->hotness * decay +
		amr_counter_read(&v->reads_pending) +
		amr_counter_read(&v->writes_pending);
}

AmrWant
amr_place(const AmrLeafVolatile *v, const AmrPolicyParams *p, AmrRule *rule,
		  bool *hold_in_dram)
{
	double		h = v->hotness;

	*hold_in_dram = v->smo_hot >= p->psi;
	if (*hold_in_dram)
	{
		*rule = AMR_RULE_R6;
		return AMR_WANT_STAY;
	}
	if (h > p->theta_down && h > 0 && v->update_hot / h >= p->phi)
	{
		*rule = AMR_RULE_R3;
		return AMR_WANT_PMEM;
	}
	if (h >= p->theta_up)
	{
		*rule = AMR_RULE_R4;
		return AMR_WANT_PMEM;
	}
	if (h <= p->theta_down)
	{
		*rule = AMR_RULE_R5;
		return AMR_WANT_SSD;
	}
	*rule = AMR_RULE_NONE;
	return AMR_WANT_STAY;
}

static int
by_hotness_asc(const void *a, const void *b)
{
	float		x = ((const AmrCandidate *) a)->hotness;
	float		y = ((const AmrCandidate *) b)->hotness;

	return (x > y) - (x < y);
}

/* moving flags kept in the candidate's spare bits while planning */
#define MOVING 0x80

size_t
amr_plan_moves(AmrCandidate *c, size_t n, uint64_t budget_leaves,
			   bool can_demote, uint64_t rule_quota, AmrMove *moves)
{
	size_t		nmoves = 0;
	uint64_t	pmem = 0;
	size_t		i;
	size_t		coldest = 0;

	for (i = 0; i < n; i++)
		if (c[i].tier == AMR_TIER_PMEM)
			pmem++;
	qsort(c, n, sizeof(AmrCandidate), by_hotness_asc);

	/*
	 * R5: cold leaves to SSD, coldest first, only as many as the pool must
	 * free (rule_quota, from amr_rule_excess).  Being cold alone is no reason
	 * to leave PMEM: demoting every cold leaf emptied PMEM after a build
	 * (nobody has queried its leaves yet), left PMEM paid for but idle, and
	 * made queries wait for SSD reads.  With a budget, PMEM holds the hottest
	 * leaves up to it, and the coldest leave first when it is exceeded
	 * (below).
	 */
	if (can_demote)
	{
		for (i = 0; i < n && rule_quota > 0; i++)
		{
			if (c[i].tier == AMR_TIER_PMEM && c[i].want == AMR_WANT_SSD)
			{
				moves[nmoves].leaf_id = c[i].leaf_id;
				moves[nmoves].kind = AMR_MOVE_DEMOTE_RULE;
				nmoves++;
				c[i].rule |= MOVING;
				pmem--;
				rule_quota--;
			}
		}
	}

	/*
	 * R3/R4: promotions, hottest first, while they fit the budget; past it, a
	 * promotion displaces the coldest remaining PMEM leaf if that one is at
	 * most half as hot (so that two leaves cannot swap back and forth).
	 */
	for (i = n; i-- > 0;)
	{
		if (c[i].tier != AMR_TIER_SSD || c[i].want != AMR_WANT_PMEM)
			continue;
		if (pmem < budget_leaves)
		{
			moves[nmoves].leaf_id = c[i].leaf_id;
			moves[nmoves].kind = AMR_MOVE_PROMOTE;
			nmoves++;
			c[i].rule |= MOVING;
			pmem++;
			continue;
		}
		if (!can_demote)
			continue;
		/* c is ascending by hotness: advance to the coldest movable PMEM leaf */
		while (coldest < i && (c[coldest].tier != AMR_TIER_PMEM ||
							   (c[coldest].rule & MOVING)))
			coldest++;
		if (coldest >= i || c[coldest].hotness * 2.0f > c[i].hotness)
			continue;
		moves[nmoves].leaf_id = c[coldest].leaf_id;
		moves[nmoves].kind = AMR_MOVE_DEMOTE_BUDGET;
		nmoves++;
		c[coldest].rule |= MOVING;
		moves[nmoves].leaf_id = c[i].leaf_id;
		moves[nmoves].kind = AMR_MOVE_PROMOTE;
		nmoves++;
		c[i].rule |= MOVING;
	}

	/* budget: demote the coldest PMEM leaves until within it */
	if (can_demote && pmem > budget_leaves)
	{
		for (i = 0; i < n && pmem > budget_leaves; i++)
		{
			if (c[i].tier != AMR_TIER_PMEM || (c[i].rule & MOVING))
				continue;
			moves[nmoves].leaf_id = c[i].leaf_id;
			moves[nmoves].kind = AMR_MOVE_DEMOTE_BUDGET;
			nmoves++;
			c[i].rule |= MOVING;
			pmem--;
		}
	}
	return nmoves;
}

uint64_t
amr_rule_excess(uint64_t used, uint64_t nslots, int high_pct, int low_pct)
{
	uint64_t	low_slots;

	if (high_pct < 0)
		high_pct = 0;
	if (low_pct > high_pct)
		low_pct = high_pct;
	if (low_pct < 0)
		low_pct = 0;
	if (nslots == 0 || used * 100 <= nslots * (uint64_t) high_pct)
		return 0;
	low_slots = nslots * (uint64_t) low_pct / 100;
	return used > low_slots ? used - low_slots : 0;
}

/* qsort order of AmrColdRef: coldest first */
static int
by_coldness(const void *a, const void *b)
{
	const AmrColdRef *x = a;
	const AmrColdRef *y = b;

	if (x->hotness != y->hotness)
		return x->hotness < y->hotness ? -1 : 1;
	/* ties (every leaf of a fresh build has hotness 0): lower list first */
	return (x->list > y->list) - (x->list < y->list);
}

uint64_t
amr_share_rule_quota(AmrCandidate *const *cands, const size_t *n, size_t nlists,
					 uint64_t excess, AmrColdRef *scratch, uint64_t *quota)
{
	size_t		ncold = 0;
	size_t		l;
	size_t		i;
	uint64_t	shared = 0;

	for (l = 0; l < nlists; l++)
	{
		quota[l] = 0;
		for (i = 0; i < n[l]; i++)
		{
			if (cands[l][i].tier != AMR_TIER_PMEM || cands[l][i].want != AMR_WANT_SSD)
				continue;
			scratch[ncold].hotness = cands[l][i].hotness;
			scratch[ncold].list = (uint32_t) l;
			ncold++;
		}
	}
	if (excess == 0 || ncold == 0)
		return 0;
	qsort(scratch, ncold, sizeof(AmrColdRef), by_coldness);
	for (i = 0; i < ncold && shared < excess; i++, shared++)
		quota[scratch[i].list]++;
	return shared;
}

uint64_t
amr_budget_leaves(AmrBudgetKind kind, double value, uint64_t nleaves)
{
	switch (kind)
	{
		case AMR_BUDGET_FRACTION:
			return (uint64_t) floor(value * (double) nleaves + 1e-9);
		case AMR_BUDGET_BYTES:
			return (uint64_t) (value / AMR_SLOT_SIZE);
		default:
			return UINT64_MAX;
	}
}

uint32_t
amr_new_image_tier(uint64_t budget_leaves, uint64_t pmem_leaves, int new_pmem, bool strict)
{
	if (budget_leaves == UINT64_MAX || pmem_leaves + (uint64_t) new_pmem <= budget_leaves)
		return AMR_TIER_PMEM;
	return strict ? AMR_TIER_SSD : AMR_TIER_PMEM;
}
