/*-------------------------------------------------------------------------
 *
 * amr_policy.h
 *		Placement policy (paper 3.5-3.10, Table 1): hotness with decay and
 *		hysteresis, rules R3-R6, and budget enforcement.
 *
 * Hotness follows h = h * exp(-lambda * dt) + 1 per access.  To keep the
 * access path to one relaxed atomic increment, accesses are counted per leaf
 * and folded into the decayed scores by the tier manager at each scan: the
 * accesses of one interval are added at its end, which matches the formula
 * to within a factor exp(lambda * interval) for accesses inside it.
 *
 * Rules (evaluated for every leaf at every scan, in this order):
 *	 R6  smo_hot >= psi                  hold a copy in DRAM (write-through:
 *										 the persistent copy still has a tier)
 *	 R3  update_hot / hotness >= phi
 *		 and hotness > theta_down         on PMEM (promote if on SSD)
 *	 R4  hotness >= theta_up             on PMEM (promote if on SSD)
 *	 R5  hotness <= theta_down           on SSD  (demote if on PMEM)
 *	 otherwise                           stay (the hysteresis band)
 * R5 makes room: it demotes only while the PMEM tier (the pool, shared by
 * every tree) is above its high watermark, coldest first, down to the low
 * watermark (amr_rule_excess); otherwise a cold leaf stays where it is.
 * With a finite PMEM budget, PMEM keeps the hottest leaves up to it and the
 * coldest are demoted when it is exceeded.  R1/R2 (inner nodes kept in
 * DRAM) hold by construction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_POLICY_H
#define AMR_POLICY_H

#include "amr_tree.h"

typedef struct AmrPolicyParams
{
	double		lambda;			/* decay per second */
	double		theta_up;		/* promote at hotness >= theta_up */
	double		theta_down;		/* demote at hotness <= theta_down */
	double		phi;			/* update ratio for R3 */
	double		psi;			/* split score for R6 */
} AmrPolicyParams;

typedef enum AmrWant
{
	AMR_WANT_STAY = 0,
	AMR_WANT_PMEM,				/* R3 or R4 */
	AMR_WANT_SSD				/* R5 */
} AmrWant;

typedef enum AmrRule
{
	AMR_RULE_NONE = 0,
	AMR_RULE_R3,
	AMR_RULE_R4,
	AMR_RULE_R5,
	AMR_RULE_R6
} AmrRule;

/* Fold the pending accesses of a leaf into its decayed scores at "now". */
extern void amr_hotness_fold(AmrLeafVolatile *v, double now, double lambda);

/* Current (decayed, pending included) hotness, without changing the state. */
extern double amr_hotness_now(const AmrLeafVolatile *v, double now, double lambda);

/* Apply the rules to folded scores; *rule says which one decided. */
extern AmrWant amr_place(const AmrLeafVolatile *v, const AmrPolicyParams *p,
						 AmrRule *rule, bool *hold_in_dram);

/* One leaf of a tree as the planner sees it. */
typedef struct AmrCandidate
{
	uint32_t	leaf_id;
	uint8_t		tier;			/* AMR_TIER_PMEM or AMR_TIER_SSD */
	uint8_t		want;			/* AmrWant */
	uint8_t		rule;			/* AmrRule */
	uint8_t		held;			/* R6: held in DRAM (informational) */
	float		hotness;
} AmrCandidate;

typedef enum AmrMoveKind
{
	AMR_MOVE_PROMOTE,			/* SSD -> PMEM, rules R3/R4 */
	AMR_MOVE_DEMOTE_RULE,		/* PMEM -> SSD, rule R5 */
	AMR_MOVE_DEMOTE_BUDGET		/* PMEM -> SSD, over budget: coldest first */
} AmrMoveKind;

typedef struct AmrMove
{
	uint32_t	leaf_id;
	AmrMoveKind kind;
} AmrMove;

/*
 * Plan the moves of one tree: rule demotions of its coldest R5 leaves on
 * PMEM, at most rule_quota of them (the tree's share of amr_rule_excess; 0:
 * R5 demotes nothing), promotions that fit the budget (or displace a PMEM
 * leaf at most half as hot), and budget demotions of the coldest PMEM
 * leaves until PMEM holds at most budget_leaves (UINT64_MAX: unlimited).
 * Without an SSD tier nothing is demoted.  cands is reordered (ascending
 * hotness).  Returns the number of moves written to "moves" (room for n).
 */
extern size_t amr_plan_moves(AmrCandidate *cands, size_t n, uint64_t budget_leaves,
							 bool can_demote, uint64_t rule_quota, AmrMove *moves);

/*
 * The PMEM slots rule R5 should free: when more than high_pct percent of the
 * nslots slots are used, enough to bring the use down to low_pct percent
 * (taken as at most high_pct); 0 otherwise.
 */
extern uint64_t amr_rule_excess(uint64_t used, uint64_t nslots, int high_pct, int low_pct);

/* A leaf that rule R5 would demote, and the candidate list it belongs to. */
typedef struct AmrColdRef
{
	float		hotness;
	uint32_t	list;
} AmrColdRef;

/*
 * Share "excess" R5 demotions among the candidate lists cands[0..nlists)
 * (one per tree, n[i] candidates each; n[i] = 0 leaves a list out): the
 * coldest R5 candidates on PMEM across all lists, at most excess of them;
 * quota[i] receives how many are list i's (the rule_quota of its
 * amr_plan_moves).  scratch has room for every candidate.  Returns the sum.
 */
extern uint64_t amr_share_rule_quota(AmrCandidate *const *cands, const size_t *n,
									 size_t nlists, uint64_t excess,
									 AmrColdRef *scratch, uint64_t *quota);

/*
 * The PMEM leaves a budget allows an index of nleaves leaves: a fraction of
 * them (rounded down), or bytes / AMR_SLOT_SIZE; UINT64_MAX when unlimited.
 */
extern uint64_t amr_budget_leaves(AmrBudgetKind kind, double value, uint64_t nleaves);

/*
 * The tier for new images that add new_pmem leaves to PMEM if put there,
 * given the budget (amr_budget_leaves, of the index as it will be) and the
 * PMEM leaves it has: PMEM within the budget; beyond it SSD if strict, else
 * PMEM (the tier manager restores the budget at its next pass; see
 * docs/design.md, "Inserts and the budget").
 */
extern uint32_t amr_new_image_tier(uint64_t budget_leaves, uint64_t pmem_leaves,
								   int new_pmem, bool strict);

#endif							/* AMR_POLICY_H */
