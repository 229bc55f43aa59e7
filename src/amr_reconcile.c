/*-------------------------------------------------------------------------
 *
 * amr_reconcile.c
 *		Bring the DRAM tier back from the pool after any (re)start.
 *
 * Runs once per server lifetime (and again after every crash-restart, since
 * shared memory is then new), in the first process that uses amrtree, after
 * WAL recovery has finished, and before anything can create an entry.  It
 *
 *	1. resolves trees left BUILDING by a crash (committed creator: VALID;
 *	   otherwise the tree is dropped), finishes interrupted drops, drops
 *	   every tree if the data directory's history was reset (a restored
 *	   backup, a promoted standby: see note_history_reset), drops the trees
 *	   of temporary tables (whose backends are gone), and reclaims orphans:
 *	   trees whose index no longer exists;
 *	2. walks the Leaf Table once: a leaf survives if its tree is live, its
 *	   generation matches, and -- if it came from a split -- its origin's
 *	   version has moved past the split (otherwise the split never reached
 *	   its commit point and this half is discarded); unlogged trees are
 *	   emptied after a crash, as PostgreSQL empties unlogged relations;
 *	   the slot and leaf-id bitmaps are rebuilt from the surviving words,
 *	   so a slot that no word references is free again;
 *	3. after a crash, prunes every entry whose WAL insert position lies
 *	   beyond the end of the replayed WAL (docs/design.md, "No
 *	   phantom rows");
 *	4. bulk-loads every tree's inner nodes from the Leaf Table boxes (STR),
 *	   without reading a single leaf.
 *
 * It is idempotent: an ERROR (e.g. DRAM too small) or a crash leaves the
 * pool in a state from which the next attempt reaches the same result.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"

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

/* amrtree writes no WAL records (yet); a record with its id is foreign */
static void
amr_rmgr_redo(XLogReaderState *record)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("amrtree writes no WAL records, but a record for WAL resource manager %d was found",
					(int) XLogRecGetRmid(record)),
			 errhint("Another extension may use the same resource manager id; set amrtree.wal_rmgr_id to a different value.")));
}

static void
amr_rmgr_desc(StringInfo buf, XLogReaderState *record)
{
}

static const char *
amr_rmgr_identify(uint8 info)
{
	return NULL;
}

/* Startup process, at the end of redo: see above.  Must not fail. */
static void
amr_rmgr_cleanup(void)
{
	AmrPoolHeader *hdr = amr_store.header;
	XLogRecPtr	replay_end;

	if (!amr_pool_is_open())
		return;
	replay_end = GetXLogReplayRecPtr(NULL);
	if (XLogRecPtrIsInvalid(replay_end))
		return;
	if (hdr->prune_horizon == 0 ||
		(hdr->prune_horizon & AMR_HORIZON_PROVISIONAL) ||
		(uint64) replay_end < hdr->prune_horizon)
		persist_header_u64(&hdr->prune_horizon, (uint64) replay_end);
}

static RmgrData amr_rmgr = {
	.rm_name = "amrtree",
	.rm_redo = amr_rmgr_redo,
	.rm_desc = amr_rmgr_desc,
	.rm_identify = amr_rmgr_identify,
	.rm_cleanup = amr_rmgr_cleanup,
};

/* At preload: the resource manager whose cleanup callback marks redo's end. */
void
amr_register_wal_rmgr(int rmid)
{
	RegisterCustomRmgr((RmgrId) rmid, &amr_rmgr);
}

/*
 * Is the index that owned this tree gone?  Yes if its main fork does not
 * exist (while its database directory is gone too, or is there), is empty
 * (PostgreSQL truncates a dropped relation's first segment at commit and
 * unlinks it at the next checkpoint), or starts with a page that is not
 * this tree's metapage (the relfilenode was reused).  Anything uncertain --
 * a missing tablespace, an I/O error, a short file -- keeps the tree: a
 * leaked tree costs space, a wrongly dropped one costs a REINDEX.
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
	memcpy(&meta, PageGetContents((Page) page.data), sizeof(meta));
	if (meta.magic != AMR_META_MAGIC)
		return true;
	return meta.pool_id != amr_shared->pool_id || meta.tree_no != tree_no ||
		meta.tree_generation != rec->generation;
}

/*
 * Drop every entry whose WAL insert position lies beyond "horizon", the end
 * of the WAL that recovery replayed: its heap tuple may never have become
 * durable (docs/design.md, "No phantom rows").  PMEM entries are marked
 * dead in place, which is idempotent.  An SSD image is read only if its
 * Leaf Table lsn_hint says it may hold such an entry; if it does, the image
 * is rewritten without them to a fresh slot and the word switched to it.
 * Returns the number of entries dropped.
 */
static uint64
prune_beyond(XLogRecPtr horizon, const uint8 *keep)
{
	AmrStore   *s = &amr_store;
	AmrLeaf    *buf = amr_alloc_leaf_buffer();
	AmrLeaf    *img = amr_alloc_leaf_buffer();
	uint64		pruned = 0;
	uint32		id;

	for (id = 0; id < s->lt_capacity; id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];
		uint64		word = amr_lt_word(s, id);
		uint64		i;
		uint64		n;

		if ((id & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (!keep[id] || AMR_WORD_TIER(word) == AMR_TIER_NONE)
			continue;

		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			AmrLeaf    *leaf = amr_pmem_slot(s, AMR_WORD_SLOT(word));

			if (leaf->hdr.magic != AMR_LEAF_MAGIC)
				continue;
			n = Min(leaf->hdr.nentries, (uint64) AMR_LEAF_CAPACITY);
			for (i = 0; i < n; i++)
			{
				if (!(leaf->entries[i].flags & AMR_ENTRY_FLAG_DEAD) &&
					leaf->entries[i].insert_lsn > horizon)
				{
					amr_leaf_mark_dead(leaf, (int) i);
					pruned++;
				}
			}
		}
		else
		{
			uint32		slot = AMR_WORD_SLOT(word);
			uint32		tier;
			uint32		new_slot;
			AmrFBox		mbr;

			if (e->lsn_hint != AMR_LSN_HINT_UNKNOWN &&
				((uint64) e->lsn_hint << AMR_LSN_HINT_SHIFT) <= horizon)
				continue;
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
				continue;
			}
			amr_leaf_image_init(img, id, buf->hdr.tree_no, buf->hdr.tree_generation,
								AMR_WORD_VERSION(word) + 1,
								(buf->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0);
			for (i = 0; i < buf->hdr.nentries; i++)
			{
				if (buf->entries[i].flags & AMR_ENTRY_FLAG_DEAD)
					continue;
				if (buf->entries[i].insert_lsn > horizon)
					pruned++;
				else
					img->entries[img->hdr.nentries++] = buf->entries[i];
			}
			if (img->hdr.nentries == amr_leaf_live_entries(buf))
				continue;		/* the hint was loose: nothing to drop */

			if (!amr_try_take_slot(AMR_SLOT_REPLACES, AMR_TIER_SSD, &tier, &new_slot))
				ereport(ERROR,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("amrtree cannot finish crash recovery: no free leaf slot to rewrite leaf %u",
								id),
						 errhint("Raise amrtree.ssd_size or amrtree.pmem_size and restart the server.")));
			/* the box of the old image still covers the survivors */
			mbr = amr_lt_mbr(s, id, word);
			amr_leaf_write_image(NULL, tier, new_slot, img);
			(void) amr_leaf_switch(&s->trees[buf->hdr.tree_no], id, tier, new_slot, &mbr, img,
								   false);
		}
	}
	return pruned;
}

/* What one reconciliation did, for its log line. */
typedef struct ReconcileCounts
{
	uint32		dropped_leaves;
	uint32		discarded_splits;
	uint32		live_leaves;
	uint32		orphans;
	uint32		stale;
	uint32		temporary;
	uint64		pruned;
} ReconcileCounts;

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
 * Step 1: every tree record gets its final state: BUILDING resolves by its
 * creator's fate; a reset history, a temporary table or a vanished index
 * drops the tree.
 */
static void
resolve_tree_records(bool history_reset, ReconcileCounts *c)
{
	uint32		tn;

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &amr_store.tree_records[tn];

		if (rec->state == AMR_TREE_BUILDING)
			persist_state(rec, creator_committed((TransactionId) rec->create_xid) ?
						  AMR_TREE_VALID : AMR_TREE_DROPPED);
		else if (rec->state != AMR_TREE_FREE && rec->state != AMR_TREE_VALID &&
				 rec->state != AMR_TREE_DROPPED)
		{
			ereport(WARNING,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("amrtree: tree record %u has unknown state %u; dropping it",
							tn, rec->state)));
			persist_state(rec, AMR_TREE_DROPPED);
		}

		if (rec->state != AMR_TREE_VALID)
			continue;
		if (history_reset)
		{
			persist_state(rec, AMR_TREE_DROPPED);
			c->stale++;
		}
		else if (rec->flags & AMR_TREE_FLAG_TEMP)
		{
			/* no temporary relation outlives the backends of a server life */
			persist_state(rec, AMR_TREE_DROPPED);
			c->temporary++;
		}
		else if (tree_owner_gone(rec, tn))
		{
			persist_state(rec, AMR_TREE_DROPPED);
			c->orphans++;
		}
	}
	if (c->stale > 0)
		ereport(LOG,
				(errmsg("amrtree: dropped the trees of %u indexes: this data directory was restored or was a standby, so the PMEM pool does not match it",
						c->stale),
				 errhint("REINDEX every amrtree index; until then using one raises an error.")));
	if (c->orphans > 0)
		ereport(LOG,
				(errmsg("amrtree: reclaiming the trees of %u indexes that no longer exist",
						c->orphans)));
	if (c->temporary > 0)
		ereport(LOG,
				(errmsg("amrtree: reclaiming the trees of %u indexes of temporary tables",
						c->temporary)));
}

/*
 * Step 2a: for every used Leaf Table entry, whether it survives: its tree
 * is live and of its generation, it is not an unlogged tree's after a
 * crash, it is not the half of a split whose origin never switched, and its
 * slot is in range and not taken twice (the slot bitmaps are rebuilt from
 * the survivors here).  Decided before anything is released: releasing
 * bumps a version, which must not make a half-published split look
 * complete.  Returns keep[], one byte per leaf id.
 */
static uint8 *
decide_leaves(bool after_crash, ReconcileCounts *c)
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
		if (rec == NULL || rec->state != AMR_TREE_VALID ||
			rec->generation != e->tree_generation)
			keep[id] = 0;
		else if ((rec->flags & AMR_TREE_FLAG_UNLOGGED) && after_crash)
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
			if (!ok)
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

/* Step 4: dropped trees lost their last leaf in step 2b: free their records. */
static void
finish_drops(bool history_reset)
{
	uint32		tn;

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
		if (amr_store.tree_records[tn].state == AMR_TREE_DROPPED)
			persist_state(&amr_store.tree_records[tn], AMR_TREE_FREE);
	if (history_reset)
		persist_header_u64(&amr_store.header->history_reset, 0);
}

/*
 * Step 5: count every tree's leaves and entries per tier, and bulk-load its
 * inner nodes (STR) from the Leaf Table boxes, without reading a single SSD
 * leaf (their entry counts are in the Leaf Table: SSD images are immutable).
 */
static void
rebuild_trees(uint32 live_leaves)
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

		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			AmrLeaf    *leaf = amr_pmem_slot(s, AMR_WORD_SLOT(word));

			if (leaf->hdr.magic == AMR_LEAF_MAGIC && leaf->hdr.nentries <= AMR_LEAF_CAPACITY)
				t->nentries += amr_leaf_live_entries(leaf);
			t->pmem_leaves++;
		}
		else
		{
			t->nentries += e->entries;
			t->ssd_leaves++;
		}
		t->nleaves++;
	}

	node_ids = palloc_extended(sizeof(uint32) *
							   (amr_build_levels_nodes_needed(live_leaves, AMR_REBUILD_INNER_FILL) + 2),
							   MCXT_ALLOC_HUGE);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		int			side;

		if (s->tree_records[tn].state != AMR_TREE_VALID)
			continue;
		for (side = 0; side < 2; side++)
		{
			uint32		b = tn * 2 + side;
			AmrStatus	st;

			st = amr_build_levels(s, &s->trees[tn], side == 1, items + start[b],
								  start[b + 1] - start[b], AMR_REBUILD_INNER_FILL,
								  scratch, node_ids);
			if (st != AMR_OK)
				ereport(ERROR,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("amrtree DRAM area is too small to hold the inner nodes of every index"),
						 errdetail("%u inner nodes fit in amrtree.dram_size = %d kB; the pool holds %u leaves.",
								   s->nnodes, amr_dram_size_kb, live_leaves),
						 errhint("Raise amrtree.dram_size and restart the server.")));
		}
	}
}

void
amr_reconcile(void)
{
	AmrPoolHeader *hdr = amr_store.header;
	bool		history_reset = hdr->history_reset != 0;
	/* every unclean start records a horizon (amr_note_unclean_start) */
	bool		after_crash = hdr->prune_horizon != 0;
	XLogRecPtr	horizon = InvalidXLogRecPtr;
	ReconcileCounts c = {0};
	MemoryContext cxt;
	MemoryContext old;
	uint8	   *keep;

	if (AMR_FAULT_ACTIVE("reconcile:fail"))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree reconciliation refused by amrtree.fault_injection")));

	cxt = AllocSetContextCreate(CurrentMemoryContext, "amrtree reconcile",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);

	reset_volatile_state();
	resolve_tree_records(history_reset, &c);

	/* the WAL position entries are pruned to, if a crash preceded us */
	if (after_crash)
		horizon = (XLogRecPtr) (hdr->prune_horizon & ~AMR_HORIZON_PROVISIONAL);
	AMR_FAULT_POINT("reconcile:after_prune_horizon");

	keep = decide_leaves(after_crash, &c);
	release_dropped_leaves(keep, &c);
	AMR_FAULT_POINT("reconcile:after_release");

	/* step 3: entries whose heap insert may not have survived the crash */
	if (after_crash)
	{
		if (!XLogRecPtrIsInvalid(horizon))
			c.pruned = prune_beyond(horizon, keep);
		AMR_FAULT_POINT("reconcile:after_prune");
		persist_header_u64(&hdr->prune_horizon, 0);
	}

	finish_drops(history_reset);
	/* releases and rewrites above moved the tier counts: count afresh */
	reset_tree_counts();
	rebuild_trees(c.live_leaves);

	pg_atomic_fetch_add_u64(&amr_shared->rebuilds, 1);
	ereport(LOG,
			(errmsg("amrtree: rebuilt inner nodes from the Leaf Table: %u leaves live, %u released, %u half-published splits discarded",
					c.live_leaves, c.dropped_leaves, c.discarded_splits),
			 !XLogRecPtrIsInvalid(horizon) ?
			 errdetail("After the crash, " UINT64_FORMAT " entries inserted beyond the end of the replayed WAL (%X/%X) were dropped.",
					   c.pruned, LSN_FORMAT_ARGS(horizon)) : 0));

	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}

/*
 * Everything that touches an index starts here: errors out (with the
 * reason) when amrtree was not preloaded, the pool could not be opened, or
 * the server is a hot standby; on first use after a (re)start it
 * reconciles the pool and rebuilds the inner nodes (amr_reconcile), once,
 * under the attach lock.
 */
void
amr_require_ready(void)
{
	if (!amr_preloaded || amr_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree must be loaded via shared_preload_libraries"),
				 errhint("Add amrtree to shared_preload_libraries in postgresql.conf and restart the server.")));
	if (!amr_pool_ready())
		amr_pool_report_unusable();
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("amrtree indexes cannot be used during recovery"),
				 errdetail("amrtree leaves live outside the WAL, so a hot standby has none."),
				 errhint("Run the query on the primary; after promoting this server, REINDEX its amrtree indexes.")));

	if (pg_atomic_read_u32(&amr_shared->attached) != 0)
		return;
	LWLockAcquire(&amr_shared->attach_lock, LW_EXCLUSIVE);
	if (pg_atomic_read_u32(&amr_shared->attached) == 0)
	{
		amr_reconcile();
		pg_atomic_write_u32(&amr_shared->attached, 1);
	}
	LWLockRelease(&amr_shared->attach_lock);
}

