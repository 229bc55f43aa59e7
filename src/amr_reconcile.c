/*-------------------------------------------------------------------------
 *
 * amr_reconcile.c
 *		Bring the DRAM tier back from the pool after any (re)start, and
 *		finish what recovery leaves to amrtree.
 *
 * Two steps, because WAL replay needs the first and the second needs what
 * only the end of recovery provides (the commit log's verdicts, relation
 * files as they are, permission to write WAL):
 *
 * Attach (amr_attach) builds the DRAM tier from the pool, reading no
 * catalog and writing no WAL, so the startup process can run it before it
 * replays amrtree's records (amr_walredo.c); otherwise the first process
 * that uses amrtree runs it.  It
 *
 *	1. keeps the trees that are VALID or BUILDING and releases what is left
 *	   of dropped ones (interrupted drops, temporary tables' trees);
 *	2. walks the Leaf Table once: a leaf survives if its tree is live, its
 *	   generation matches, and -- if it came from a split -- its origin's
 *	   version has moved past the split (otherwise the split never reached
 *	   its commit point and this half is discarded); the slot and leaf-id
 *	   bitmaps are rebuilt from the surviving words, so a slot that no word
 *	   references is free again;
 *	3. bulk-loads every tree's inner nodes from the Leaf Table boxes (STR),
 *	   without reading a single leaf -- or, before WAL replay, leaves that
 *	   to each tree's first use (amr_tree_open): replay keeps leaves and
 *	   the Leaf Table, and inner nodes only where they exist, so that it
 *	   never depends on amrtree.dram_size.
 *
 * Finish (in amr_require_ready, once recovery is over) then
 *
 *	4. resolves trees left BUILDING by their creator's fate, reclaims
 *	   orphans (trees whose index no longer exists), drops every tree if
 *	   replay could not use the pool at all;
 *	5. after a crash or any recovery, empties unlogged trees (as
 *	   PostgreSQL empties unlogged relations), prunes every entry whose
 *	   WAL position lies beyond the end of the replayed WAL (docs/design.md,
 *	   "No phantom rows"), and logs again, whole, every leaf that changed
 *	   beyond it (its record never reached durable WAL, so a standby or an
 *	   archive does not have the change: "resync").
 *
 * Both are idempotent: an ERROR (e.g. DRAM too small) or a crash leaves the
 * pool in a state from which the next attempt reaches the same result.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"
#include "amr_wal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/transam.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogreader.h"
#include "access/xlogrecovery.h"
#include "catalog/pg_tablespace_d.h"
#include "common/relpath.h"
#include "miscadmin.h"
#include "storage/bufpage.h"
#include "storage/procarray.h"
#include "utils/memutils.h"

/* inner nodes of rebuilt trees are filled this far, leaving room to grow */
#define AMR_REBUILD_INNER_FILL ((AMR_INNER_FANOUT * 7) / 8)

static bool
creator_committed(TransactionId xid)
{
	if (!TransactionIdIsNormal(xid))
		return false;

	/*
	 * A BUILDING record older than the commit log can only be a tree whose
	 * creator finished long ago without this pool being used since; treat it
	 * as committed rather than dropping a tree that queries may need.
	 */
	if (TransactionIdPrecedes(xid, ShmemVariableCache->oldestClogXid))
		return true;
	if (TransactionIdIsInProgress(xid))
		return false;
	return TransactionIdDidCommit(xid);
}

static void
persist_state(AmrTreeRecord *rec, uint32 state)
{
	rec->state = state;
	amr_persist(&rec->state, sizeof(rec->state));
}

static void
persist_header_u64(uint64 *field, uint64 value)
{
	*field = value;
	amr_persist(field, sizeof(*field));
}

/*
 * The pruning horizon (step 3) is the end of the WAL that the first
 * recovery after a crash replayed.  It must be known for certain even if
 * the server stops again before any process reconciles: once recovery has
 * ended, PostgreSQL writes new WAL past that point (its end-of-recovery
 * checkpoint first), and it even marks the control file "shut down" for a
 * moment after that checkpoint, so a stop in that window makes the next
 * start look clean.  Hence the horizon lives in the pool header, set in
 * two steps before anything else can run:
 *
 *	- the postmaster, seeing an unclean control file (or restarting its
 *	  children after a crash), records the latest checkpoint as a
 *	  provisional horizon: if there is nothing to replay, the WAL ends with
 *	  that checkpoint record and no entry before it can be a phantom;
 *	- the startup process, at the end of redo, replaces it with the exact
 *	  end of the replayed WAL (a WAL resource manager's cleanup callback,
 *	  the one hook that runs there).
 *
 * A horizon that is not provisional is only ever lowered: a recovery after
 * a crash in the middle of pruning replays more WAL than the first one,
 * including WAL written after the first one ended.  Reconciliation clears
 * the horizon once every tree is pruned to it.
 */
#define AMR_HORIZON_PROVISIONAL (UINT64CONST(1) << 63)

/* Postmaster, at an unclean start: see above. */
void
amr_note_unclean_start(XLogRecPtr last_checkpoint)
{
	AmrPoolHeader *hdr = amr_store.header;

	if (hdr->prune_horizon == 0 || (hdr->prune_horizon & AMR_HORIZON_PROVISIONAL))
		persist_header_u64(&hdr->prune_horizon,
						   AMR_HORIZON_PROVISIONAL | (uint64) last_checkpoint);
}

/*
 * Startup process, at the end of redo (amr_redo_cleanup): the horizon
 * becomes the exact end of the replayed WAL.  Must not fail.
 */
void
amr_note_replay_end(XLogRecPtr replay_end)
{
	AmrPoolHeader *hdr = amr_store.header;

	if (!amr_pool_is_open() || XLogRecPtrIsInvalid(replay_end))
		return;
	if (hdr->prune_horizon == 0 ||
		(hdr->prune_horizon & AMR_HORIZON_PROVISIONAL) ||
		(uint64) replay_end < hdr->prune_horizon)
		persist_header_u64(&hdr->prune_horizon, (uint64) replay_end);
}

/*
 * Is the index that owned this tree gone?  Yes if its main fork does not
 * exist (while its database directory is gone too, or is there), is empty
 * (PostgreSQL truncates a dropped relation's first segment at commit and
 * unlinks it at the next checkpoint), or starts with a page that is not
 * this tree's metapage (the relfilenode was reused).  Anything uncertain --
 * a missing tablespace, an I/O error, a short file, a page that fails its
 * checksum -- keeps the tree: a leaked tree costs space, a wrongly dropped
 * one costs a REINDEX.
 *
 * Reads the file itself, not through shared buffers: reconciliation runs
 * after the end-of-recovery checkpoint (or a clean shutdown's), so the
 * metapage on disk is current.
 */
static bool
tree_owner_gone(const AmrTreeRecord *rec, uint32 tree_no)
{
	RelFileNode rnode;
	char	   *path;
	char	   *dbpath;
	PGAlignedBlock page;
	AmrMetaPageData meta;
	struct stat st;
	ssize_t		n;
	int			fd;
	bool		gone = false;

	rnode.spcNode = rec->spc_oid;
	rnode.dbNode = rec->db_oid;
	rnode.relNode = rec->relfilenode;
	path = relpathperm(rnode, MAIN_FORKNUM);
	fd = open(path, O_RDONLY | PG_BINARY, 0);
	if (fd < 0)
	{
		if (errno == ENOENT)
		{
			/* the database (or just the file) is gone -- or the tablespace */
			dbpath = GetDatabasePath(rec->db_oid, rec->spc_oid);
			if (stat(dbpath, &st) == 0)
				gone = true;
			else if (errno == ENOENT)
			{
				char		spcpath[MAXPGPATH];

				/* a dropped database, unless its tablespace is missing */
				if (rec->spc_oid == DEFAULTTABLESPACE_OID)
					gone = stat("base", &st) == 0;
				else
				{
					snprintf(spcpath, sizeof(spcpath), "pg_tblspc/%u", rec->spc_oid);
					gone = stat(spcpath, &st) == 0;
				}
			}
			pfree(dbpath);
		}
		pfree(path);
		return gone;
	}
	n = pread(fd, page.data, BLCKSZ, 0);
	close(fd);
	pfree(path);
	if (n == 0)
		return true;
	if (n != BLCKSZ || PageIsNew((Page) page.data))
		return false;

	/*
	 * A page that fails PostgreSQL's own verification (its data checksum, or
	 * a header that is no page's) may well be this tree's metapage with a
	 * damaged byte, and a damaged byte in the tree number or generation would
	 * make it look like another tree's: that is uncertain, so the tree stays.
	 * Reading the index then reports the damage as PostgreSQL does ("invalid
	 * page in block 0"), ignore_checksum_failure still reaches the tree, and
	 * REINDEX replaces it; dropping it here would instead leave an index
	 * whose tree is gone and whose metapage cannot be read, which the
	 * background rebuild cannot find either.
	 */
	if (!PageIsVerifiedExtended((Page) page.data, 0, 0))
		return false;
	memcpy(&meta, PageGetContents((Page) page.data), sizeof(meta));
	if (meta.magic != AMR_META_MAGIC)
		return true;
	if (meta.pool_id == amr_shared->pool_id)
		return meta.tree_no != tree_no || meta.tree_generation != rec->generation;

	/*
	 * Built in another pool: a standby's own pool, whose trees WAL replay
	 * created under numbers of its own.  The storage identity is what keys a
	 * tree, and the file is there.
	 */
	return false;
}

/* What one reconciliation did, for its log lines. */
typedef struct ReconcileCounts
{
	uint32		dropped_leaves;
	uint32		discarded_splits;
	uint32		live_leaves;
	uint32		suspect_leaves;
	uint32		orphans;
	uint32		aborted;
	uint32		stale;
	uint32		temporary;
	uint32		unlogged;
	uint32		broken;
	uint64		pruned;
	uint32		resynced;
} ReconcileCounts;

/* ---- attach ---- */

/* Step 0: start from nothing, for this may be a retry after an ERROR. */
static void
reset_volatile_state(void)
{
	AmrStore   *s = &amr_store;
	uint32		id;
	uint32		tn;

	amr_bitmap_init(s->pmem_used, s->pmem_nslots);
	if (s->ssd_used)
		amr_bitmap_init(s->ssd_used, s->ssd_nslots);
	amr_bitmap_init(s->leaf_ids_used, s->lt_capacity);
	amr_bitmap_init(s->nodes_used, s->nnodes);
	amr_bitmap_init(amr_leaf_cache_used, amr_leaf_cache_n);
	for (id = 0; id < s->lt_capacity; id++)
		amr_leaf_volatile_reset(&s->leaves[id]);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
		amr_tree_descriptor_init(&s->trees[tn], tn, &s->tree_records[tn]);
}

/*
 * Step 1: trees that are neither VALID nor BUILDING lose their leaves here;
 * so do temporary tables' trees, whose backends are gone.  BUILDING trees
 * wait for finish(), which knows their creators' fate.
 */
static void
resolve_tree_records(ReconcileCounts *c)
{
	uint32		tn;

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &amr_store.tree_records[tn];

		if (rec->state != AMR_TREE_FREE && rec->state != AMR_TREE_VALID &&
			rec->state != AMR_TREE_BUILDING && rec->state != AMR_TREE_DROPPED)
		{
			ereport(WARNING,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("amrtree: tree record %u has unknown state %u; dropping it",
							tn, rec->state)));
			persist_state(rec, AMR_TREE_DROPPED);
		}
		if ((rec->state == AMR_TREE_VALID || rec->state == AMR_TREE_BUILDING) &&
			(rec->flags & AMR_TREE_FLAG_TEMP))
		{
			/* no temporary relation outlives the backends of a server life */
			persist_state(rec, AMR_TREE_DROPPED);
			c->temporary++;
		}
	}
	if (c->temporary > 0)
		ereport(LOG,
				(errmsg("amrtree: reclaiming the trees of %u indexes of temporary tables",
						c->temporary)));
}

/*
 * Step 2a: for every used Leaf Table entry, whether it survives: its tree
 * is live and of its generation, it is not the half of a split whose origin
 * never switched, and its slot is in range and not taken twice (the slot
 * bitmaps are rebuilt from the survivors here).  Decided before anything is
 * released: releasing bumps a version, which must not make a half-published
 * split look complete.  Returns keep[], one byte per leaf id.
 *
 * Before WAL replay a slot out of range or taken twice is expected of a
 * pool copied by a base backup while leaves moved (docs/design.md, "Torn
 * copies"): such a leaf is kept but marked suspect, for replay will install
 * a whole image of it; finish() checks that it did.
 */
static uint8 *
decide_leaves(bool before_replay, ReconcileCounts *c)
{
	AmrStore   *s = &amr_store;
	uint32		cap = s->lt_capacity;
	uint8	   *keep = palloc_extended(cap + 1, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	uint32		id;

	for (id = 0; id < cap; id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];
		uint64		word = amr_lt_word(s, id);
		AmrTreeRecord *rec;

		if ((id & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (AMR_WORD_TIER(word) == AMR_TIER_NONE)
			continue;
		keep[id] = 1;
		rec = e->tree_no < AMR_MAX_TREES ? &s->tree_records[e->tree_no] : NULL;
		if (rec == NULL ||
			(rec->state != AMR_TREE_VALID && rec->state != AMR_TREE_BUILDING) ||
			rec->generation != e->tree_generation)
			keep[id] = 0;
		else if (e->split_origin != AMR_INVALID_LEAF &&
				 (e->split_origin >= cap ||
				  AMR_WORD_VERSION(amr_lt_word(s, e->split_origin)) <= e->split_origin_version))
		{
			keep[id] = 0;
			c->discarded_splits++;
		}
		else
		{
			uint32		tier = AMR_WORD_TIER(word);
			uint32		slot = AMR_WORD_SLOT(word);
			bool		ok;

			if (tier == AMR_TIER_PMEM)
				ok = slot < s->pmem_nslots && amr_bitmap_set(s->pmem_used, slot);
			else if (tier == AMR_TIER_SSD)
				ok = s->ssd_used != NULL && slot < s->ssd_nslots &&
					amr_bitmap_set(s->ssd_used, slot);
			else
				ok = false;
			if (!ok && before_replay)
			{
				s->leaves[id].flags |= AMR_LEAF_VOLATILE_SUSPECT;
				c->suspect_leaves++;
			}
			else if (!ok)
			{
				ereport(WARNING,
						(errcode(ERRCODE_DATA_CORRUPTED),
						 errmsg("amrtree: leaf %u refers to %s slot %u, which is out of range or already in use; dropping the leaf",
								id, tier == AMR_TIER_SSD ? "SSD" : "PMEM", slot)));
				keep[id] = 0;
			}
		}
	}
	return keep;
}

/*
 * Step 2b: release what does not survive (the slot bitmaps already leave
 * their slots free) and mark the surviving leaf ids used.  This works on the
 * Leaf Table directly, before the DRAM tier exists: it is the one place that
 * does not go through the leaf store.
 */
static void
release_dropped_leaves(const uint8 *keep, ReconcileCounts *c)
{
	AmrStore   *s = &amr_store;
	uint32		id;

	for (id = 0; id < s->lt_capacity; id++)
	{
		if (AMR_WORD_TIER(amr_lt_word(s, id)) == AMR_TIER_NONE)
			continue;
		if (!keep[id])
		{
			amr_lt_release(s, id);
			c->dropped_leaves++;
			continue;
		}
		amr_bitmap_set(s->leaf_ids_used, id);
		c->live_leaves++;
	}
}

/* Counts that rebuild_trees recomputes (the leaf store kept them moving). */
static void
reset_tree_counts(void)
{
	uint32		tn;

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		amr_store.trees[tn].pmem_leaves = 0;
		amr_store.trees[tn].ssd_leaves = 0;
		amr_store.trees[tn].nleaves = 0;
		amr_store.trees[tn].nentries = 0;
	}
}

/* Step 2c: dropped trees lost their last leaf in step 2b: free their records. */
static void
finish_drops(void)
{
	uint32		tn;

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
		if (amr_store.tree_records[tn].state == AMR_TREE_DROPPED)
			persist_state(&amr_store.tree_records[tn], AMR_TREE_FREE);
}

static bool
tree_is_live(uint32 tn)
{
	uint32		state = amr_store.tree_records[tn].state;

	return state == AMR_TREE_VALID || state == AMR_TREE_BUILDING;
}

/*
 * The inner nodes do not fit: of every tree (one_tree false: live_leaves
 * counts the pool's leaves) or of one tree whose nodes are rebuilt beside
 * the others' (live_leaves counts its own).
 */
static void
report_dram_full(uint32 live_leaves, bool one_tree)
{
	ereport(ERROR,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("amrtree DRAM area is too small to hold the inner nodes of every index"),
			 one_tree ?
			 errdetail("%u inner nodes fit in amrtree.dram_size = %d kB; the other indexes' nodes leave too few of them for this index's tree (%u leaves).",
					   amr_store.nnodes, amr_dram_size_kb, live_leaves) :
			 errdetail("%u inner nodes fit in amrtree.dram_size = %d kB; the pool holds %u leaves.",
					   amr_store.nnodes, amr_dram_size_kb, live_leaves),
			 errhint("Raise amrtree.dram_size and restart the server.")));
}

/*
 * Step 3: count every tree's leaves and entries per tier, and bulk-load its
 * inner nodes (STR) from the Leaf Table boxes, without reading a single SSD
 * leaf (their entry counts are in the Leaf Table: SSD images are immutable).
 */
static void
rebuild_trees(uint32 live_leaves, bool build)
{
	AmrStore   *s = &amr_store;
	uint32	   *next = palloc0(sizeof(uint32) * (AMR_MAX_TREES * 2 + 1));
	uint32	   *start = palloc0(sizeof(uint32) * (AMR_MAX_TREES * 2 + 1));
	AmrPackItem *items = palloc_extended(sizeof(AmrPackItem) * ((Size) live_leaves + 1), MCXT_ALLOC_HUGE);
	AmrPackItem *scratch = palloc_extended(sizeof(AmrPackItem) * ((Size) live_leaves + 1), MCXT_ALLOC_HUGE);
	uint32	   *node_ids;
	uint32		id;
	uint32		tn;

	/* group leaves by (tree, side) with a counting sort */
	for (id = 0; id < s->lt_capacity; id++)
		if (AMR_WORD_TIER(amr_lt_word(s, id)) != AMR_TIER_NONE)
			start[s->lt[id].tree_no * 2 + ((s->lt[id].flags & AMR_LT_FLAG_NULLS) ? 1 : 0) + 1]++;
	for (tn = 1; tn <= AMR_MAX_TREES * 2; tn++)
		start[tn] += start[tn - 1];
	memcpy(next, start, sizeof(uint32) * AMR_MAX_TREES * 2);
	for (id = 0; id < s->lt_capacity; id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];
		uint64		word = amr_lt_word(s, id);
		AmrTree    *t = &s->trees[e->tree_no];
		uint32		bucket;

		if (AMR_WORD_TIER(word) == AMR_TIER_NONE)
			continue;
		bucket = e->tree_no * 2 + ((e->flags & AMR_LT_FLAG_NULLS) ? 1 : 0);
		items[next[bucket]].box = amr_lt_mbr(s, id, word);
		items[next[bucket]].ref = id;
		next[bucket]++;

		t->nentries += amr_leaf_current_entries(id, word);
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
			t->pmem_leaves++;
		else
			t->ssd_leaves++;
		t->nleaves++;
	}

	if (!build)
	{
		/*
		 * WAL replay comes first: the nodes are built at each tree's first
		 * use
		 */
		for (tn = 0; tn < AMR_MAX_TREES; tn++)
			if (tree_is_live(tn))
				s->trees[tn].inner_stale = 1;
		return;
	}
	node_ids = palloc_extended(sizeof(uint32) *
							   (amr_build_levels_nodes_needed(live_leaves, AMR_REBUILD_INNER_FILL) + 2),
							   MCXT_ALLOC_HUGE);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		int			side;

		if (!tree_is_live(tn))
			continue;
		for (side = 0; side < 2; side++)
		{
			uint32		b = tn * 2 + side;

			if (amr_build_levels(s, &s->trees[tn], side == 1, items + start[b],
								 start[b + 1] - start[b], AMR_REBUILD_INNER_FILL,
								 scratch, node_ids) != AMR_OK)
				report_dram_full(live_leaves, false);
		}
	}
}

void
amr_tree_rebuild_inner(AmrTree *t)
{
	AmrStore   *s = &amr_store;
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree rebuild",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	uint32		n[2] = {0, 0};
	AmrPackItem *items[2];
	AmrPackItem *scratch;
	uint32	   *node_ids;
	uint32		id;
	uint64		word;
	uint64		nentries = 0;
	int			side;

	for (id = 0; amr_lt_next_of_tree(s, t->tree_no, t->generation, &id, &word); id++)
		n[(s->lt[id].flags & AMR_LT_FLAG_NULLS) ? 1 : 0]++;
	items[0] = palloc_extended(sizeof(AmrPackItem) * ((Size) n[0] + 1), MCXT_ALLOC_HUGE);
	items[1] = palloc_extended(sizeof(AmrPackItem) * ((Size) n[1] + 1), MCXT_ALLOC_HUGE);
	scratch = palloc_extended(sizeof(AmrPackItem) * ((Size) Max(n[0], n[1]) + 1), MCXT_ALLOC_HUGE);
	node_ids = palloc_extended(sizeof(uint32) *
							   (amr_build_levels_nodes_needed(Max(n[0], n[1]), AMR_REBUILD_INNER_FILL) + 2),
							   MCXT_ALLOC_HUGE);
	n[0] = n[1] = 0;
	for (id = 0; amr_lt_next_of_tree(s, t->tree_no, t->generation, &id, &word); id++)
	{
		int			sd = (s->lt[id].flags & AMR_LT_FLAG_NULLS) ? 1 : 0;

		items[sd][n[sd]].box = amr_lt_mbr(s, id, word);
		items[sd][n[sd]].ref = id;
		n[sd]++;
		nentries += amr_leaf_current_entries(id, word);
	}
	amr_tree_free_nodes(s, t);
	t->root = t->null_root = AMR_INVALID_NODE;
	t->height = t->null_height = 0;
	amr_counter_set(&t->ninner, 0);
	for (side = 0; side < 2; side++)
		if (amr_build_levels(s, t, side == 1, items[side], n[side], AMR_REBUILD_INNER_FILL,
							 scratch, node_ids) != AMR_OK)
			report_dram_full(n[0] + n[1], true);
	amr_counter_set(&t->nleaves, (uint64) n[0] + n[1]);
	amr_counter_set(&t->nentries, nentries);
	t->inner_stale = 0;
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}

void
amr_attach(bool before_replay)
{
	ReconcileCounts c = {0};
	MemoryContext cxt;
	MemoryContext old;
	uint8	   *keep;

	cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree attach",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);

	reset_volatile_state();
	resolve_tree_records(&c);
	keep = decide_leaves(before_replay, &c);
	release_dropped_leaves(keep, &c);
	AMR_FAULT_POINT("reconcile:after_release");
	finish_drops();
	/* releases above moved the tier counts: count afresh */
	reset_tree_counts();
	rebuild_trees(c.live_leaves, !before_replay);

	pg_atomic_fetch_add_u64(&amr_shared->rebuilds, 1);
	ereport(LOG,
			(before_replay ?
			 errmsg("amrtree: attached the pool for WAL replay: %u leaves live, %u released, %u half-published splits discarded",
					c.live_leaves, c.dropped_leaves, c.discarded_splits) :
			 errmsg("amrtree: rebuilt inner nodes from the Leaf Table: %u leaves live, %u released, %u half-published splits discarded",
					c.live_leaves, c.dropped_leaves, c.discarded_splits),
			 c.suspect_leaves > 0 ?
			 errdetail("%u leaves name slots they cannot own, as in a pool copied by a base backup; WAL replay is to restore them.",
					   c.suspect_leaves) : 0));

	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}

/* ---- finish ---- */

/*
 * Empty an unlogged tree after a crash or a recovery, as PostgreSQL resets
 * unlogged relations to their init fork: every leaf goes, an empty root
 * stays.
 */
static void
empty_tree(AmrTree *t)
{
	AmrStore   *s = &amr_store;
	uint32		id;
	uint64		word;

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	for (id = 0; amr_lt_next_of_tree(s, t->tree_no, t->generation, &id, &word); id++)
	{
		LWLockAcquire(amr_leaf_lock(id), LW_EXCLUSIVE);
		amr_leaf_free(t, id);
		LWLockRelease(amr_leaf_lock(id));
	}
	amr_tree_free_nodes(s, t);
	t->root = t->null_root = AMR_INVALID_NODE;
	if (amr_tree_init_empty(s, t) != AMR_OK)
		report_dram_full(0, true);
	t->inner_stale = 0;
	amr_counter_set(&t->nleaves, 0);
	amr_counter_set(&t->nentries, 0);
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);
}

/*
 * Step 5, for one leaf (held exclusively): drop its entries beyond the
 * horizon (their heap tuples may never have become durable), and say
 * whether it holds a change whose WAL record did not survive: then the WAL
 * that standbys and archives hold disagrees with it, and it is logged
 * again, whole.  PMEM entries are marked dead in place; an SSD image is
 * read only if its Leaf Table lsn_hint (which also covers the record of the
 * image's last rewrite) says it may be affected, and rewritten without the
 * pruned entries to a fresh slot.  *image receives the leaf's image after
 * the pruning (in place for PMEM, in buf or img for SSD).
 */
static bool
prune_leaf(AmrTree *t, uint32 id, XLogRecPtr horizon, AmrLeaf *buf, AmrLeaf *img,
		   const AmrLeaf **image, uint64 *pruned, int64 *count_delta)
{
	AmrStore   *s = &amr_store;
	AmrLeafTableEntry *e = &s->lt[id];
	uint64		word = amr_lt_word(s, id);
	bool		stamped = e->lsn_hint == AMR_LSN_HINT_UNKNOWN ||
	((uint64) e->lsn_hint << AMR_LSN_HINT_SHIFT) > horizon;
	uint64		i;
	uint64		n;
	uint64		dropped = 0;

	if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
	{
		AmrLeaf    *leaf;

		if (AMR_WORD_SLOT(word) >= s->pmem_nslots)
			return false;		/* queries that reach it will report it */
		leaf = amr_pmem_slot(s, AMR_WORD_SLOT(word));
		if (leaf->hdr.magic != AMR_LEAF_MAGIC || leaf->hdr.leaf_id != id)
			return false;
		n = Min(leaf->hdr.nentries, (uint64) AMR_LEAF_CAPACITY);
		for (i = 0; i < n; i++)
		{
			if (!(leaf->entries[i].flags & AMR_ENTRY_FLAG_DEAD) &&
				leaf->entries[i].insert_lsn > horizon)
			{
				amr_leaf_mark_dead(leaf, (int) i);
				dropped++;
			}
		}
		if (dropped > 0)
			amr_leaf_refresh_copy(id, leaf);
		*image = leaf;
		*count_delta = -(int64) dropped;
	}
	else
	{
		uint32		slot = AMR_WORD_SLOT(word);
		uint32		tier;
		uint32		new_slot;
		AmrFBox		mbr;
		int64		listed = e->entries;

		if (!stamped)
			return false;
		if (slot >= s->ssd_nslots)
			return false;		/* queries that reach it will report it */
		amr_ssd_read_images(NULL, &slot, &buf, 1);
		if (buf->hdr.magic != AMR_LEAF_MAGIC || buf->hdr.leaf_id != id ||
			buf->hdr.version != AMR_WORD_VERSION(word) ||
			!amr_leaf_image_checksum_ok(buf))
		{
			/* queries that reach it will report it, naming the index */
			ereport(WARNING,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("amrtree: leaf %u in SSD slot %u is damaged; it was not checked for entries beyond the replayed WAL",
							id, slot)));
			return false;
		}
		*image = buf;
		amr_leaf_image_init(img, id, t->tree_no, t->generation, AMR_WORD_VERSION(word) + 1,
							(buf->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0);
		for (i = 0; i < buf->hdr.nentries; i++)
		{
			if (buf->entries[i].flags & AMR_ENTRY_FLAG_DEAD)
				continue;
			if (buf->entries[i].insert_lsn > horizon)
				dropped++;
			else
				img->entries[img->hdr.nentries++] = buf->entries[i];
		}
		if (dropped > 0)
		{
			if (!amr_try_take_slot(AMR_SLOT_REPLACES, AMR_TIER_SSD, &tier, &new_slot))
				ereport(ERROR,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("amrtree cannot finish crash recovery: no free leaf slot to rewrite leaf %u",
								id),
						 errhint("Raise amrtree.ssd_size or amrtree.pmem_size and restart the server.")));
			/* the box of the old image still covers the survivors */
			mbr = amr_lt_mbr(s, id, word);
			amr_leaf_write_image(NULL, tier, new_slot, img);

			/*
			 * Not logged here: the caller logs the whole tree's changed
			 * leaves in one record.  A switch never lowers the leaf's
			 * lsn_hint, which lies beyond the horizon (it brought us here),
			 * so a crash before that record is durable leaves the next
			 * pruning pass (to the same horizon: it stays in the pool header
			 * until a pass completes) reading this leaf and logging it.
			 */
			(void) amr_leaf_switch(NULL, t, id, tier, new_slot, &mbr, img, false,
								   AMR_LOG_NONE);
			AMR_FAULT_POINT("reconcile:after_prune_rewrite");
			*image = img;
		}
		else if (amr_leaf_live_entries(buf) != e->entries)
		{
			/*
			 * A switch interrupted between the entry's count and its word:
			 * the count is the unpublished image's.  Its change's record did
			 * not survive (replay would have switched again), so the leaf's
			 * lsn_hint, written with the count, lies beyond the horizon and
			 * brought us here.  The tree counted the wrong number at attach;
			 * the delta below corrects it.
			 */
			e->entries = (uint16) amr_leaf_live_entries(buf);
			amr_persist(&e->entries, sizeof(e->entries));
		}
		/* the tree counted this leaf's Leaf Table count at attach */
		*count_delta = (int64) amr_leaf_live_entries(*image) - listed;
	}
	*pruned += dropped;
	return dropped > 0 || stamped;
}

/*
 * One tree's resync record being assembled: its images as XLOG_AMR_IMAGES
 * carries them.
 */
typedef struct ResyncBatch
{
	int			n;
	uint32		leaf_ids[AMR_WAL_MAX_RESYNC_IMAGES];
	StringInfoData data;
} ResyncBatch;

/*
 * Log the images gathered for tree t, as its last (or only) resync record,
 * or as a part that more follow; returns the record's end.
 */
static XLogRecPtr
resync_flush(AmrTree *t, ResyncBatch *b, bool more)
{
	XLogRecPtr	end;

	Assert(b->n > 0);
	end = amr_wal_resync(t, more ? AMR_IMAGE_RESYNC_PART : AMR_IMAGE_RESYNC, b->n,
						 b->leaf_ids, b->data.data, b->data.len);
	AMR_FAULT_POINT("reconcile:after_resync_record");
	b->n = 0;
	resetStringInfo(&b->data);
	return end;
}

/* Add a leaf's image (pruned) to the tree's resync record. */
static void
resync_add(ResyncBatch *b, uint32 id, const AmrLeaf *image)
{
	xl_amr_image h;
	uint16		n = (uint16) Min(image->hdr.nentries, (uint64) AMR_LEAF_CAPACITY);

	h.leaf_id = id;
	h.version = image->hdr.version;
	h.flags = (uint16) (image->hdr.flags & AMR_LEAF_FLAG_NULLS);
	h.nentries = n;
	h.fresh_pos = AMR_NO_FRESH_ENTRY;
	h.reserved = 0;
	appendBinaryStringInfo(&b->data, (const char *) &h, sizeof(h));
	if (n > 0)
		appendBinaryStringInfo(&b->data, (const char *) image->entries,
							   n * sizeof(AmrLeafEntry));
	b->leaf_ids[b->n++] = id;
}

/*
 * Step 5: pruning and resynchronisation of every live tree's leaves.
 *
 * All of a tree's changed leaves go into one record (up to
 * AMR_WAL_MAX_RESYNC_IMAGES, then in parts), logged after the tree's
 * pruning: a standby applies a record atomically for its scans, and one
 * leaf per record left it, between two of them, with one half of a split
 * whose record was lost and not the other (docs/design.md, "WAL").
 * Nothing else changes leaves meanwhile: every other user of amrtree waits
 * for finish (amr_require_ready).  A crash before a tree's record leaves
 * its leaves stamped beyond the horizon (pruning in place keeps the stamp,
 * and a switch never lowers it), so the next pass, to the same horizon,
 * logs them again.  The records are flushed before the horizon is reset:
 * after that, nothing would find these leaves again.
 */
static void
prune_and_resync(XLogRecPtr horizon, ReconcileCounts *c)
{
	AmrStore   *s = &amr_store;
	AmrLeaf    *buf = amr_alloc_leaf_buffer();
	AmrLeaf    *img = amr_alloc_leaf_buffer();
	ResyncBatch *batch = palloc(sizeof(ResyncBatch));
	XLogRecPtr	last = InvalidXLogRecPtr;
	int			max_images = AMR_FAULT_ACTIVE("reconcile:resync_in_parts") ? 1 :
	AMR_WAL_MAX_RESYNC_IMAGES;
	uint32		tn;

	batch->n = 0;
	initStringInfo(&batch->data);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTree    *t = &s->trees[tn];
		AmrTreeRecord *rec = &s->tree_records[tn];
		bool		logged;
		uint32		id;
		uint64		word;

		if (rec->state != AMR_TREE_VALID || (rec->flags & AMR_TREE_FLAG_UNLOGGED))
			continue;
		logged = amr_wal_wanted(t, NULL);
		LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
		LWLockAcquire(amr_tree_lock(t), LW_SHARED);
		for (id = 0; amr_lt_next_of_tree(s, tn, t->generation, &id, &word); id++)
		{
			const AmrLeaf *image = NULL;
			uint64		pruned = 0;
			int64		count_delta = 0;

			if ((id & 0xFFF) == 0)
				CHECK_FOR_INTERRUPTS();
			LWLockAcquire(amr_leaf_lock(id), LW_EXCLUSIVE);
			if (prune_leaf(t, id, horizon, buf, img, &image, &pruned, &count_delta) &&
				logged && image)
			{
				/* a full record: this one is a part, more follow */
				if (batch->n == max_images)
					last = resync_flush(t, batch, true);
				resync_add(batch, id, image);
				c->resynced++;
			}
			LWLockRelease(amr_leaf_lock(id));
			if (count_delta < 0)
				amr_counter_sub(&t->nentries, (uint64) -count_delta);
			else if (count_delta > 0)
				amr_counter_add(&t->nentries, (uint64) count_delta);
			c->pruned += pruned;
		}
		if (batch->n > 0)
			last = resync_flush(t, batch, false);
		LWLockRelease(amr_tree_lock(t));
		LWLockRelease(&amr_shared->publish_lock);
	}
	if (!XLogRecPtrIsInvalid(last))
		XLogFlush(last);
	pfree(batch->data.data);
	pfree(batch);
}

/*
 * Steps 4 and 5, in a backend once recovery is over (see the file header).
 * Trees are freed and emptied through the directory and the leaf store,
 * with their locks: queries that began on a hot standby may still run.
 */
static void
finish(void)
{
	AmrStore   *s = &amr_store;
	AmrPoolHeader *hdr = amr_store.header;
	bool		history_reset = hdr->history_reset != 0;

	/* every recovery, and every unclean start, records a horizon */
	bool		recovered = hdr->prune_horizon != 0;
	XLogRecPtr	horizon = (XLogRecPtr) (hdr->prune_horizon & ~AMR_HORIZON_PROVISIONAL);
	ReconcileCounts c = {0};
	MemoryContext cxt;
	MemoryContext old;
	uint32		tn;
	uint32		id;

	if (AMR_FAULT_ACTIVE("reconcile:fail"))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree reconciliation refused by amrtree.fault_injection")));

	cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree finish",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);

	/* leaves replay was to restore and did not: their trees are unusable */
	for (id = 0; id < s->lt_capacity; id++)
	{
		uint64		word = amr_lt_word(s, id);
		uint32		owner = s->lt[id].tree_no;

		if (!(s->leaves[id].flags & (AMR_LEAF_VOLATILE_SUSPECT | AMR_LEAF_VOLATILE_AWAITS_IMAGE)) ||
			AMR_WORD_TIER(word) == AMR_TIER_NONE || owner >= AMR_MAX_TREES ||
			(s->tree_records[owner].flags & AMR_TREE_FLAG_BROKEN))
			continue;
		/* a build the crash cut short: reclaimed below, nothing to report */
		if (s->tree_records[owner].state == AMR_TREE_BUILDING &&
			!creator_committed((TransactionId) s->tree_records[owner].create_xid))
			continue;
		ereport(WARNING,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 (s->leaves[id].flags & AMR_LEAF_VOLATILE_SUSPECT) ?
				 errmsg("amrtree: leaf %u of tree %u names a slot it cannot own, and WAL replay did not restore it",
						id, owner) :
				 errmsg("amrtree: leaf %u of tree %u awaited a whole image that WAL replay did not reach",
						id, owner),
				 errhint("Its index is rebuilt in the background (amrtree.auto_rebuild) or needs REINDEX; until then queries do not use it.")));
		amr_tree_mark_broken(owner);
	}

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &s->tree_records[tn];

		if (rec->state == AMR_TREE_BUILDING)
		{
			if (creator_committed((TransactionId) rec->create_xid))
				persist_state(rec, AMR_TREE_VALID);
			else
			{
				amr_tree_free_storage(tn);
				c.aborted++;
			}
		}
		if (rec->state != AMR_TREE_VALID)
			continue;
		if (rec->flags & AMR_TREE_FLAG_RESYNC_OPEN)
		{
			/*
			 * Replay ended (a promotion, a recovery target) between the parts
			 * of one resync of this tree: some leaves are as the primary's
			 * crash recovery left them, others as they were before, and the
			 * images that would make them agree are lost with the primary.
			 */
			ereport(WARNING,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("amrtree: WAL replay ended in the middle of a resynchronisation of tree %u of relation %u/%u/%u",
							tn, rec->spc_oid, rec->db_oid, rec->relfilenode),
					 errdetail("The primary logged the leaves its crash recovery found changed in several records, and recovery ended before the last of them."),
					 errhint("Its index is rebuilt in the background (amrtree.auto_rebuild) or needs REINDEX; until then queries do not use it.")));
			amr_tree_mark_broken(tn);
			rec->flags &= ~AMR_TREE_FLAG_RESYNC_OPEN;
			amr_persist(&rec->flags, sizeof(rec->flags));
		}
		if (history_reset)
		{
			amr_tree_free_storage(tn);
			c.stale++;
		}
		else if (tree_owner_gone(rec, tn))
		{
			amr_tree_free_storage(tn);
			c.orphans++;
		}
		else if (recovered && (rec->flags & AMR_TREE_FLAG_UNLOGGED))
		{
			empty_tree(&s->trees[tn]);
			c.unlogged++;
		}
	}
	if (c.stale > 0)
		ereport(LOG,
				(errmsg("amrtree: dropped the trees of %u indexes: WAL replay could not keep the PMEM pool up to date",
						c.stale),
				 amr_auto_rebuild ?
				 errhint("They are rebuilt in the background (amrtree.auto_rebuild); until then queries do not use them.") :
				 errhint("REINDEX them (amrtree.auto_rebuild is off); until then queries do not use them.")));
	if (c.orphans > 0)
		ereport(LOG,
				(errmsg("amrtree: reclaiming the trees of %u indexes that no longer exist",
						c.orphans)));
	if (c.aborted > 0)
		ereport(LOG,
				(errmsg("amrtree: reclaiming the trees of %u index builds that did not commit",
						c.aborted)));
	if (history_reset)
		persist_header_u64(&hdr->history_reset, 0);

	if (recovered)
	{
		AMR_FAULT_POINT("reconcile:after_prune_horizon");
		if (!XLogRecPtrIsInvalid(horizon))
			prune_and_resync(horizon, &c);
		AMR_FAULT_POINT("reconcile:after_prune");
		persist_header_u64(&hdr->prune_horizon, 0);
		ereport(LOG,
				(errmsg("amrtree: after recovery to %X/%X, dropped " UINT64_FORMAT " entries inserted beyond it",
						LSN_FORMAT_ARGS(horizon), c.pruned),
				 c.resynced > 0 ?
				 errdetail("%u leaves that changed beyond it were logged again, whole.", c.resynced) : 0));
		if (c.unlogged > 0)
			ereport(LOG,
					(errmsg("amrtree: emptied the trees of %u unlogged indexes after recovery",
							c.unlogged)));
	}

	/* a new pool, or trees lost or damaged: visit every database once */
	if (amr_pool_created_at_start() || c.stale > 0)
		amr_heal_request_all();
	else
		for (tn = 0; tn < AMR_MAX_TREES; tn++)
			if (tree_is_live(tn) && (s->tree_records[tn].flags & AMR_TREE_FLAG_BROKEN))
			{
				amr_heal_request_all();
				break;
			}

	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}

/* Everything that touches an index starts here: see amrtree.h. */
void
amr_require_ready(void)
{
	XLogRecPtr	position;

	if (!amr_preloaded || amr_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree must be loaded via shared_preload_libraries"),
				 errhint("Add amrtree to shared_preload_libraries in postgresql.conf and restart the server.")));
	if (!amr_pool_ready())
		amr_pool_report_unusable();
	if (RecoveryInProgress())
	{
		/* a hot standby: WAL replay attached the pool and maintains it */
		if (pg_atomic_read_u32(&amr_shared->replay_failed) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("amrtree indexes cannot be used on this standby"),
					 errdetail("WAL replay could not bring the PMEM pool up to date; the server log says why."),
					 errhint("Run the query on the primary.")));
		if (pg_atomic_read_u32(&amr_shared->attached) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("amrtree indexes cannot be used before WAL replay has begun")));
		if (!amr_lineage_replay_caught_up(&position))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("amrtree indexes cannot be used until WAL replay reaches %X/%X",
							LSN_FORMAT_ARGS(position)),
					 errdetail("The PMEM pool holds changes up to that position; before replay passes it, an index could miss rows that exist at the replayed position."),
					 errhint("Retry once the standby has replayed that far: pg_last_wal_replay_lsn() shows its progress.")));
		return;
	}

	if (pg_atomic_read_u32(&amr_shared->finished) != 0)
		return;
	/* an ERROR releases the lock with the others; the next use retries */
	LWLockAcquire(&amr_shared->attach_lock, LW_EXCLUSIVE);
	if (pg_atomic_read_u32(&amr_shared->attached) == 0)
	{
		amr_attach(false);
		pg_atomic_write_u32(&amr_shared->attached, 1);
	}
	if (pg_atomic_read_u32(&amr_shared->finished) == 0)
	{
		finish();
		pg_atomic_write_u32(&amr_shared->finished, 1);
	}
	LWLockRelease(&amr_shared->attach_lock);
}
