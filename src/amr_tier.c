/*-------------------------------------------------------------------------
 *
 * amr_tier.c
 *		The tier manager: hotness, rules R3-R6, budget enforcement and
 *		migration between PMEM and SSD (paper 3.2 b-c, 3.5-3.10, Algorithms
 *		2-4), run by the "amrtree tier manager" background worker every
 *		amrtree.scan_interval and on demand by amrtree_settle().
 *
 * "Pass" here means one tier-manager cycle over a tree, never an index
 * scan; the user-facing names amrtree.scan_interval and the "scans" and
 * "last_scan" columns of amrtree_tier_stats() predate that distinction and
 * are kept for compatibility.  Likewise "hold" is the R6 DRAM copy and
 * "pin" only ever the scan pin VACUUM waits for (amr_pins.c).
 *
 * One pass over a tree:
 *
 *	gather    fold each leaf's access counts into its decayed scores and
 *			  apply the rules (core/amr_policy.c);
 *	R6        hold a DRAM copy of leaves in frequent splits, release it when
 *			  they calm down;
 *	plan      rule demotions (only while the pool's PMEM is above its high
 *			  watermark: the tree's share of what brings it down to the
 *			  low one, coldest first across trees), promotions that fit
 *			  the budget, and budget demotions of the coldest PMEM leaves;
 *	migrate   copy -> persist -> switch the Leaf Table word -> reclaim.
 *
 * A migration reads the leaf and writes its new copy with no lock held
 * (SSD images are immutable while referenced; a PMEM image is copied under
 * the leaf lock in shared mode), then takes the leaf lock exclusively only
 * to check that nothing changed and to switch the word.  The old slot is
 * returned after the switch, with the lock held, so no reader can still be
 * reading it (SSD readers hold no lock but re-check the word after their
 * read).  Queries never wait for I/O done by the tier manager, and stay
 * correct whether it runs or not.
 *
 * Cycles of one tree are serialised by its tier lock (the worker, settle,
 * and amrtree_check); waiting for it is interruptible.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"

#include <math.h>

#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "access/xact.h"
#include "postmaster/bgworker.h"
#include "storage/condition_variable.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/geo_decls.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

PGDLLEXPORT void amr_tier_worker_main(Datum arg);

static bool tier_retry_waiting(uint32 tn);
static void tier_cycle_error_callback(void *arg);

/* the tree whose tier lock this process holds, released on error and exit */
static AmrTree *held_tier_tree = NULL;
static bool exit_callback_registered = false;

/*
 * The worker leaves a tree whose pass failed (a damaged leaf, an unreadable
 * SSD slot) alone for a while: an ERROR ends the whole cycle, so retrying it
 * at once would end every cycle before the trees after it and fill the log
 * several times a second.  The wait doubles with each failure in a row and
 * is forgotten when a pass of the tree succeeds or its record is reused (a
 * rebuild).  Queries on the tree still raise the error themselves.
 */
#define TIER_RETRY_MIN_SECS		10
#define TIER_RETRY_MAX_SECS		600

typedef struct TierRetry
{
	uint32		generation;		/* of the tree record that failed */
	int			wait_secs;		/* since the last failure; 0: none */
	TimestampTz retry_at;
} TierRetry;

static TierRetry *tier_retry = NULL;	/* AMR_MAX_TREES entries, worker only */
static int	cycling_tree = -1;	/* tree_no whose pass the worker runs */

/* Seconds since the Unix epoch, for the hotness decay and last_tier_pass. */
double
amr_now_seconds(void)
{
	return (double) GetCurrentTimestamp() / USECS_PER_SEC +
		(double) ((POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY);
}

static void
release_tier_on_exit(int code, Datum arg)
{
	amr_tier_unlock();
}

/*
 * The tier lock of a tree serialises its tier-manager cycles with
 * amrtree_settle and amrtree_check.  It is held for whole cycles, with I/O
 * and interrupts allowed, so it is not an LWLock (those hold off
 * interrupts): a busy flag set by compare-and-swap, and a condition
 * variable that waiters sleep on until a holder lets go.  A holder that
 * errors out lets go in its transaction's abort (or, for the worker, in its
 * error handler), one that exits in before_shmem_exit.
 */
bool
amr_tier_trylock(AmrTree *t)
{
	uint32		expected = 0;

	if (!exit_callback_registered)
	{
		before_shmem_exit(release_tier_on_exit, (Datum) 0);
		exit_callback_registered = true;
	}
	if (!amr_flag_try_take(&t->tier_busy, &expected, (uint32) MyProcPid))
		return false;
	held_tier_tree = t;
	return true;
}

void
amr_tier_lock(AmrTree *t)
{
	if (amr_tier_trylock(t))
		return;
	ConditionVariablePrepareToSleep(&amr_shared->tier_cv);
	while (!amr_tier_trylock(t))
		ConditionVariableSleep(&amr_shared->tier_cv, PG_WAIT_EXTENSION);
	ConditionVariableCancelSleep();
}

void
amr_tier_unlock(void)
{
	if (held_tier_tree != NULL)
	{
		amr_flag_release(&held_tier_tree->tier_busy);
		held_tier_tree = NULL;
		ConditionVariableBroadcast(&amr_shared->tier_cv);
	}
}

static void
tier_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		amr_tier_unlock();
}

static void
tier_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		amr_tier_unlock();
}

/* At preload: a backend's tier lock goes when its transaction aborts. */
void
amr_tier_register_callbacks(void)
{
	RegisterXactCallback(tier_xact_callback, NULL);
	RegisterSubXactCallback(tier_subxact_callback, NULL);
}

static AmrPolicyParams
current_params(void)
{
	AmrPolicyParams p;

	p.lambda = amr_decay_lambda;
	p.theta_up = amr_promote_threshold;
	p.theta_down = Min(amr_demote_threshold, amr_promote_threshold);
	p.phi = amr_update_ratio_threshold;
	p.psi = amr_smo_threshold;
	return p;
}

/* One leaf on its way to another tier. */
typedef struct Migration
{
	uint32		leaf_id;
	uint64		word;			/* the word when we copied the image */
	bool		has_slot;		/* a slot on the target tier is taken */
	uint32		slot;
	AmrLeaf    *img;			/* the copy, with the next version stamped */
} Migration;

/*
 * Copy -> write the leaf's image to a new slot on tier "to" (paper
 * Algorithms 3 and 4), with no lock held.  SSD images are only copied
 * here: the caller writes the whole batch with one submission and syncs it
 * once.  Caller holds the publish lock in shared mode (the slot is taken
 * but not yet referenced).  Returns false if there is nothing to do or the
 * target tier has no slot to spare: moving a leaf is optional, so it
 * leaves the reserve to the paths that must not fail (AMR_SLOT_MIGRATES).
 */
static bool
migrate_prepare(AmrTree *t, Migration *m, uint32 to)
{
	uint32		tier;

	m->has_slot = false;
	m->word = amr_leaf_read(NULL, t, m->leaf_id, m->img, NULL, NULL);
	if (m->word == 0 || AMR_WORD_TIER(m->word) == to)
		return false;
	if (!amr_try_take_slot(AMR_SLOT_MIGRATES, to, &tier, &m->slot))
		return false;
	m->has_slot = true;
	/* the image as it will be once the word switches to it */
	m->img->hdr.version = AMR_WORD_VERSION(m->word) + 1;
	PG_TRY();
	{
		AMR_FAULT_POINT(to == AMR_TIER_PMEM ? "promote:before_copy" : "demote:before_copy");
		if (to == AMR_TIER_PMEM)
			amr_leaf_write_image(NULL, to, m->slot, m->img);
	}
	PG_CATCH();
	{
		amr_give_back_slot(to, m->slot);
		m->has_slot = false;
		PG_RE_THROW();
	}
	PG_END_TRY();
	return true;
}

/*
 * Switch the Leaf Table word to the new copy, if the leaf did not change
 * meanwhile (the commit point); the leaf store returns the old slot.  The
 * new copy must be durable.  Returns whether the leaf moved; if not, gives
 * the slot back.
 */
static bool
migrate_commit(AmrTree *t, Migration *m, uint32 to)
{
	AmrStore   *s = &amr_store;
	bool		moved = false;

	LWLockAcquire(amr_leaf_lock(m->leaf_id), LW_EXCLUSIVE);
	if (amr_lt_word(s, m->leaf_id) == m->word)
	{
		bool		unchanged = true;

		/* a PMEM image may have taken appends in place since we copied it */
		if (AMR_WORD_TIER(m->word) == AMR_TIER_PMEM)
		{
			const AmrLeaf *now = amr_pmem_slot(s, AMR_WORD_SLOT(m->word));

			unchanged = now->hdr.nentries == m->img->hdr.nentries &&
				memcmp(now->entries, m->img->entries,
					   m->img->hdr.nentries * sizeof(AmrLeafEntry)) == 0;
		}
		if (unchanged)
		{
			AmrFBox		mbr = amr_lt_mbr(s, m->leaf_id, m->word);

			START_CRIT_SECTION();
			(void) amr_leaf_switch(NULL, t, m->leaf_id, to, m->slot, &mbr, m->img, false,
								   AMR_LOG_MOVE);
			AMR_FAULT_POINT(to == AMR_TIER_PMEM ? "promote:after_switch" : "demote:after_switch");
			END_CRIT_SECTION();
			moved = true;
		}
	}
	LWLockRelease(amr_leaf_lock(m->leaf_id));
	if (!moved)
		amr_give_back_slot(to, m->slot);
	m->has_slot = false;
	return moved;
}

#define MIGRATION_BATCH 256

/*
 * Move a batch of leaves to tier "to": copy and write them all (SSD: with
 * one submission), make the writes durable with one sync (SSD), then switch
 * each.  Returns which moved in moved[].
 */
static void
migrate_batch(AmrTree *t, const uint32 *ids, int n, uint32 to, Migration *m,
			  bool *moved)
{
	int			i;

	/*
	 * The error path below gives back the slot of every migration that has
	 * one, and an error (an SSD image that fails its checksum, say) can come
	 * before the later ones are prepared.  Their has_slot must say no: the
	 * caller allocates m[] uninitialised, and a batch may be longer than the
	 * ones before it, so it may hold anything -- and a slot given back that a
	 * leaf still uses is handed to the next leaf written.
	 */
	for (i = 0; i < n; i++)
		m[i].has_slot = false;

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	PG_TRY();
	{
		uint32		slots[MIGRATION_BATCH];
		AmrLeaf    *imgs[MIGRATION_BATCH];
		int			nwrites = 0;

		Assert(n <= MIGRATION_BATCH);
		for (i = 0; i < n; i++)
		{
			m[i].leaf_id = ids[i];
			moved[i] = false;
			CHECK_FOR_INTERRUPTS();
			if (migrate_prepare(t, &m[i], to) && to == AMR_TIER_SSD)
			{
				slots[nwrites] = m[i].slot;
				imgs[nwrites] = m[i].img;
				nwrites++;
			}
		}
		if (nwrites > 0)
			amr_leaf_write_ssd_batch(NULL, slots, imgs, nwrites);
		AMR_FAULT_POINT(to == AMR_TIER_PMEM ? "promote:after_copy_persisted" : "demote:after_copy_persisted");
		for (i = 0; i < n; i++)
			if (m[i].has_slot)
				moved[i] = migrate_commit(t, &m[i], to);
	}
	PG_CATCH();
	{
		for (i = 0; i < n; i++)
			if (m[i].has_slot)
			{
				amr_give_back_slot(to, m[i].slot);
				m[i].has_slot = false;
			}
		PG_RE_THROW();
	}
	PG_END_TRY();
	LWLockRelease(&amr_shared->publish_lock);
}

/* Rule R6: hold a DRAM copy of the leaf (or let it go). */
static void
set_dram_hold(AmrTree *t, uint32 leaf_id, bool hold, AmrLeaf *buf)
{
	AmrStore   *s = &amr_store;
	uint64		word;

	if (!hold)
	{
		LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
		amr_leaf_unhold(t, leaf_id);
		LWLockRelease(amr_leaf_lock(leaf_id));
		return;
	}
	word = amr_leaf_read(NULL, t, leaf_id, buf, NULL, NULL);
	if (word == 0)
		return;
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
	if (amr_lt_word(s, leaf_id) == word)
	{
		const AmrLeaf *cur = buf;

		/* a PMEM image may have taken appends since the copy: take it now */
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
			cur = amr_pmem_slot(s, AMR_WORD_SLOT(word));
		amr_leaf_hold(t, leaf_id, cur);
	}
	LWLockRelease(amr_leaf_lock(leaf_id));
}

/* Candidates of one tree, gathered by one pass over the Leaf Table. */
typedef struct TreeCands
{
	AmrCandidate *c;
	size_t		n;
	uint32	   *hold;			/* leaves to hold in DRAM (R6) */
	size_t		nhold;
	uint32	   *release;		/* leaves whose DRAM hold ends */
	size_t		nrelease;
} TreeCands;

static void
gather(AmrTree *only, TreeCands *per_tree, double now, const AmrPolicyParams *p)
{
	AmrStore   *s = &amr_store;
	uint32		id;

	for (id = 0; id < s->lt_capacity; id++)
	{
		const AmrLeafTableEntry *e = &s->lt[id];
		uint64		word = amr_lt_word(s, id);
		AmrLeafVolatile *v = &s->leaves[id];
		TreeCands  *tc;
		AmrCandidate *c;
		AmrRule		rule;
		bool		hold;
		AmrWant		want;
		AmrTree    *t;

		if ((id & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (AMR_WORD_TIER(word) == AMR_TIER_NONE || e->tree_no >= AMR_MAX_TREES)
			continue;
		t = &s->trees[e->tree_no];
		if ((only != NULL && t != only) || e->tree_generation != t->generation ||
			amr_store.tree_records[e->tree_no].state != AMR_TREE_VALID)
			continue;
		tc = &per_tree[only ? 0 : e->tree_no];
		if (tc->c == NULL)
			continue;			/* a tree not visited in this pass */

		amr_hotness_fold(v, now, p->lambda);
		want = amr_place(v, p, &rule, &hold);
		if (hold && v->dram_copy < 0)
			tc->hold[tc->nhold++] = id;
		else if (!hold && v->dram_copy >= 0)
			tc->release[tc->nrelease++] = id;
		c = &tc->c[tc->n++];
		c->leaf_id = id;
		c->tier = (uint8) AMR_WORD_TIER(word);
		c->want = (uint8) want;
		c->rule = (uint8) rule;
		c->held = hold || v->dram_copy >= 0;
		c->hotness = v->hotness;
	}
}

/*
 * PMEM slots rule R5 should free now: what brings the pool down to the low
 * watermark once it is above the high one (above_high false: whenever it is
 * above the low one, to cap a share planned earlier in a pass by what is
 * still to free).  0 without an SSD tier.
 */
static uint64
pool_rule_excess(bool above_high)
{
	int			low = Min(amr_pmem_low_watermark, amr_pmem_high_watermark);

	if (amr_store.ssd_used == NULL)
		return 0;
	return amr_rule_excess(amr_bitmap_count(amr_store.pmem_used), amr_store.pmem_nslots,
						   above_high ? amr_pmem_high_watermark : low, low);
}

/*
 * Plan and carry out the moves of one tree, rule R5 demoting at most
 * rule_quota leaves.  Returns the number of moves.
 */
static uint64
tree_cycle(AmrTree *t, TreeCands *tc, AmrLeaf *buf, uint64 rule_quota)
{
	AmrMove    *moves;
	size_t		nmoves;
	size_t		i;
	uint64		moved = 0;
	bool		can_demote = amr_store.ssd_used != NULL;
	MemoryContext cycle_cxt;
	MemoryContext old_cxt;

	/*
	 * What one tree's cycle allocates goes when it ends: the worker visits
	 * every tree per pass, and its pass context would otherwise hold the
	 * migration buffers of all of them at once.
	 */
	cycle_cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree tier cycle",
									  ALLOCSET_DEFAULT_SIZES);
	old_cxt = MemoryContextSwitchTo(cycle_cxt);
	for (i = 0; i < tc->nrelease; i++)
		set_dram_hold(t, tc->release[i], false, buf);
	for (i = 0; i < tc->nhold; i++)
		set_dram_hold(t, tc->hold[i], true, buf);

	moves = palloc(sizeof(AmrMove) * (tc->n + 1));
	if (t->tiering)
	{
		/* others (settle, the trees before this one) may have freed room */
		rule_quota = Min(rule_quota, pool_rule_excess(false));
		nmoves = amr_plan_moves(tc->c, tc->n, amr_tree_budget_leaves(t, 0), can_demote,
								rule_quota, moves);
	}
	else
	{
		/* tiering off: everything belongs on PMEM (e.g. after ALTER INDEX) */
		nmoves = 0;
		for (i = 0; i < tc->n; i++)
			if (tc->c[i].tier == AMR_TIER_SSD)
			{
				moves[nmoves].leaf_id = tc->c[i].leaf_id;
				moves[nmoves].kind = AMR_MOVE_PROMOTE;
				nmoves++;
			}
	}

	/*
	 * promotions first (they are cheap PMEM writes), then demotions, in
	 * batches; buffers only for the moves there are (most cycles have none)
	 */
	if (nmoves > 0)
	{
		int			nbuf = (int) Min(nmoves, (size_t) MIGRATION_BATCH);
		Migration  *m = palloc(sizeof(Migration) * nbuf);
		uint32		ids[MIGRATION_BATCH];
		AmrMoveKind kinds[MIGRATION_BATCH];
		bool		done[MIGRATION_BATCH];
		int			pass;
		int			j;

		for (j = 0; j < nbuf; j++)
			m[j].img = amr_alloc_leaf_buffer();
		for (pass = 0; pass < 2; pass++)
		{
			bool		promote = pass == 0;
			int			n = 0;

			for (i = 0; i <= nmoves; i++)
			{
				if (i < nmoves && (moves[i].kind == AMR_MOVE_PROMOTE) == promote)
				{
					ids[n] = moves[i].leaf_id;
					kinds[n] = moves[i].kind;
					n++;
				}
				if (n == 0 || (n < MIGRATION_BATCH && i < nmoves))
					continue;
				migrate_batch(t, ids, n, promote ? AMR_TIER_PMEM : AMR_TIER_SSD, m, done);
				for (j = 0; j < n; j++)
				{
					if (!done[j])
						continue;
					moved++;
					amr_counter_add(&t->bytes_moved, AMR_SLOT_SIZE);
					if (promote)
						amr_counter_add(&t->promotions, 1);
					else
					{
						amr_counter_add(&t->demotions, 1);
						if (kinds[j] == AMR_MOVE_DEMOTE_BUDGET)
							amr_counter_add(&t->budget_demotions, 1);
						else
							amr_counter_add(&t->rule_demotions, 1);
					}
				}
				n = 0;
			}
		}
	}
	MemoryContextSwitchTo(old_cxt);
	MemoryContextDelete(cycle_cxt);
	amr_counter_add(&t->tier_passes, 1);
	t->last_tier_pass = amr_now_seconds();
	return moved;
}

static void
alloc_cands(TreeCands *tc, AmrTree *t)
{
	size_t		n = (size_t) (amr_counter_read(&t->pmem_leaves) +
							  amr_counter_read(&t->ssd_leaves)) + 64;

	/* leaves may be added while we gather: leave some room, and bound it */
	n = Min(n * 2, (size_t) amr_store.lt_capacity + 1);
	tc->c = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(AmrCandidate) * n);
	tc->hold = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(uint32) * n);
	tc->release = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(uint32) * n);
	tc->n = tc->nhold = tc->nrelease = 0;
}

/* One cycle over one tree (settle); caller holds its tier lock. */
uint64
amr_tier_cycle_tree(AmrTree *t)
{
	AmrPolicyParams p = current_params();
	TreeCands	tc;
	AmrLeaf    *buf = amr_alloc_leaf_buffer();
	uint64		moved;

	if (!t->tiering && t->ssd_leaves == 0)
		return 0;
	memset(&tc, 0, sizeof(tc));
	alloc_cands(&tc, t);
	gather(t, &tc, amr_now_seconds(), &p);
	/* settling one index: R5 frees what the pool needs from this tree alone */
	moved = tree_cycle(t, &tc, buf, pool_rule_excess(true));
	return moved;
}

/*
 * The share of each tree in this pass's R5 demotions (quota[tree_no]): the
 * pool's coldest R5 candidates on PMEM, among the trees with tiering on,
 * until the pool is back at its low watermark.
 */
static void
share_rule_quota(TreeCands *per_tree, uint64 *quota)
{
	uint64		excess = pool_rule_excess(true);
	AmrCandidate **cands;
	size_t	   *n;
	size_t		total = 0;
	uint32		tn;

	memset(quota, 0, sizeof(uint64) * AMR_MAX_TREES);
	if (excess == 0)
		return;
	cands = palloc(sizeof(AmrCandidate *) * AMR_MAX_TREES);
	n = palloc(sizeof(size_t) * AMR_MAX_TREES);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		cands[tn] = per_tree[tn].c;
		n[tn] = (per_tree[tn].c != NULL && amr_store.trees[tn].tiering) ? per_tree[tn].n : 0;
		total += n[tn];
	}
	(void) amr_share_rule_quota(cands, n, AMR_MAX_TREES, excess,
								MemoryContextAllocHuge(CurrentMemoryContext,
													   sizeof(AmrColdRef) * (total + 1)),
								quota);
}

/* One cycle over every tree (the worker). */
static void
cycle_all(void)
{
	AmrPolicyParams p = current_params();
	TreeCands  *per_tree = palloc0(sizeof(TreeCands) * AMR_MAX_TREES);
	AmrLeaf    *buf = amr_alloc_leaf_buffer();
	uint64	   *quota = palloc(sizeof(uint64) * AMR_MAX_TREES);
	ErrorContextCallback error_context;
	uint32		tn;
	bool		any = false;

	error_context.callback = tier_cycle_error_callback;

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTree    *t = &amr_store.trees[tn];

		/* a damaged tree waits for its rebuild, its leaves untouched */
		if (amr_store.tree_records[tn].state != AMR_TREE_VALID ||
			(amr_store.tree_records[tn].flags & AMR_TREE_FLAG_BROKEN) ||
			(!t->tiering && t->ssd_leaves == 0) ||
			tier_retry_waiting(tn))
			continue;
		alloc_cands(&per_tree[tn], t);
		any = true;
	}
	if (!any)
		return;
	gather(NULL, per_tree, amr_now_seconds(), &p);
	share_rule_quota(per_tree, quota);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTree    *t = &amr_store.trees[tn];

		if (per_tree[tn].c == NULL || !amr_tier_trylock(t))
			continue;			/* settle or a check is busy with it */
		cycling_tree = (int) tn;
		error_context.arg = &amr_store.tree_records[tn];
		error_context.previous = error_context_stack;
		error_context_stack = &error_context;
		PG_TRY();
		{
			tree_cycle(t, &per_tree[tn], buf, quota[tn]);
		}
		PG_FINALLY();
		{
			amr_tier_unlock();
		}
		PG_END_TRY();
		error_context_stack = error_context.previous;
		cycling_tree = -1;
		tier_retry[tn].wait_secs = 0;
	}
}

/* Error context of the worker's pass over one tree: which index it was. */
static void
tier_cycle_error_callback(void *arg)
{
	const AmrTreeRecord *rec = (const AmrTreeRecord *) arg;

	errcontext("placing the leaves of the amrtree index with OID %u in the database with OID %u",
			   rec->index_oid, rec->db_oid);
}

/* Is tree tn waiting for its retry after a failed pass? */
static bool
tier_retry_waiting(uint32 tn)
{
	TierRetry  *r = &tier_retry[tn];

	if (r->wait_secs == 0)
		return false;
	if (r->generation != amr_store.tree_records[tn].generation)
	{
		r->wait_secs = 0;		/* the record was reused: another tree */
		return false;
	}
	return GetCurrentTimestamp() < r->retry_at;
}

/*
 * After an error: if it came from a tree's pass, put the tree off (see
 * TierRetry) and say until when.
 */
static void
tier_retry_after_error(void)
{
	TierRetry  *r;
	const AmrTreeRecord *rec;

	if (cycling_tree < 0)
		return;
	r = &tier_retry[cycling_tree];
	rec = &amr_store.tree_records[cycling_tree];
	cycling_tree = -1;
	if (r->wait_secs > 0 && r->generation == rec->generation)
		r->wait_secs = Min(r->wait_secs * 2, TIER_RETRY_MAX_SECS);
	else
		r->wait_secs = TIER_RETRY_MIN_SECS;
	r->generation = rec->generation;
	r->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											  r->wait_secs * 1000);
	ereport(LOG,
			(errmsg("amrtree tier manager retries the index with OID %u in the database with OID %u in %d s",
					rec->index_oid, rec->db_oid, r->wait_secs),
			 errdetail("Until then none of its leaves move between tiers; the other indexes are not held up.")));
}

void
amr_tier_worker_main(Datum arg)
{
	MemoryContext cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/*
	 * No database: trees are keyed by storage identity and need no catalog.
	 * Initialising a connection to none gives us a backend status entry, so
	 * that the worker shows in pg_stat_activity.
	 */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	cxt = AllocSetContextCreate(TopMemoryContext, "amrtree tier manager",
								ALLOCSET_DEFAULT_SIZES);
	tier_retry = MemoryContextAllocZero(TopMemoryContext,
										sizeof(TierRetry) * AMR_MAX_TREES);
	MemoryContextSwitchTo(cxt);
	pgstat_report_activity(STATE_IDLE, NULL);
	/* rebuild requests wake us (amr_heal.c) */
	amr_shared->heal.tier_manager_latch = MyLatch;

	for (;;)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (long) amr_tier_pass_interval_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		if (!amr_is_ready())
			continue;

		/*
		 * An ERROR (an unreadable SSD slot, say) ends this cycle, not the
		 * worker: report it, release what we held, and try again next time.
		 */
		PG_TRY();
		{
			pgstat_report_activity(STATE_RUNNING, "placing amrtree leaves");

			/*
			 * The reconciliation after a crash may run here, and its logged
			 * rewrites hold DELAY_CHKPT_START between record and switch: in a
			 * transaction, for the vxid that makes a checkpoint wait for them
			 * (see below).
			 */
			StartTransactionCommand();
			amr_require_ready();
			CommitTransactionCommand();
			MemoryContextSwitchTo(cxt);
			amr_heal_launch_pending();

			/*
			 * A cycle runs in a transaction of its own (no xid, no snapshot)
			 * for its vxid: the checkpointer waits for processes that hold
			 * DELAY_CHKPT_START only if they have one, and a move logged
			 * whole (amr_leaf_switch) holds it between its record and its
			 * switch, so that no checkpoint completes in between.  Without
			 * it, on a PMEM or msync pool, a checkpoint could complete there
			 * and a base backup taken from it miss the switch that the record
			 * before its redo pointer stood for (write-back pools fence on
			 * their own counters, amr_writeback.c).
			 */
			StartTransactionCommand();
			MemoryContextSwitchTo(cxt);
			cycle_all();
			CommitTransactionCommand();
			MemoryContextSwitchTo(cxt);
			pgstat_report_activity(STATE_IDLE, NULL);
		}
		PG_CATCH();
		{
			HOLD_INTERRUPTS();
			EmitErrorReport();
			FlushErrorState();
			tier_retry_after_error();
			/* the rebuild launcher reads pg_database in a transaction */
			AbortOutOfAnyTransaction();
			MemoryContextSwitchTo(cxt);
			LWLockReleaseAll();
			amr_tier_unlock();
			pgstat_report_wait_end();
			RESUME_INTERRUPTS();
			pgstat_report_activity(STATE_IDLE, NULL);
		}
		PG_END_TRY();
		MemoryContextReset(cxt);
	}
}

void
amr_register_worker(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	snprintf(worker.bgw_name, BGW_MAXLEN, "amrtree tier manager");
	snprintf(worker.bgw_type, BGW_MAXLEN, "amrtree tier manager");
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	/* after recovery: the startup reconciliation needs the commit log */
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "amrtree");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "amr_tier_worker_main");
	RegisterBackgroundWorker(&worker);
}
