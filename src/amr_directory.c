/*-------------------------------------------------------------------------
 *
 * amr_directory.c
 *		The tree directory: one record per index in the pool, keyed by the
 *		index's storage identity (database, tablespace, relfilenode), and the
 *		transactional life of trees.
 *
 * A tree is created by ambuild in state BUILDING, stamped with the creating
 * transaction's xid.  Commit makes it VALID; abort (of the transaction or of
 * the subtransaction that created it) frees it.
 *
 * A tree is freed when the transaction that unlinks its index's relation
 * file commits: just before that commit we look at PostgreSQL's own list of
 * relation files to delete at commit (smgrGetPendingDeletes) and free the
 * trees keyed by them afterwards.  That one rule covers DROP INDEX, DROP
 * TABLE, DROP OWNED, and every rebuild that gives an index a new
 * relfilenode (REINDEX, TRUNCATE, VACUUM FULL, CLUSTER, ALTER TABLE ...
 * TYPE), and it gets the multi-transaction commands right: DROP INDEX
 * CONCURRENTLY and REINDEX CONCURRENTLY unlink the old file only in their
 * last transaction, after waiting for every transaction that could still be
 * scanning the index.  (An earlier version freed the tree when the drop hook
 * fired, which DROP INDEX CONCURRENTLY does in its first transaction: open
 * cursors then lost rows or read a tree that had replaced it.)  The two
 * exceptions are handled apart: DROP DATABASE removes whole directories
 * (its drop hook marks every tree of the database), and a table truncated
 * in the transaction that created it rebuilds its indexes in place, in the
 * same file (amr_tree_create supersedes the older tree of that storage).
 * A crash in between is resolved at the next start (amr_reconcile.c) from
 * the xid and the state.  Nothing here raises an ERROR in an abort path.
 *
 * Indexes find their tree through the metapage in block 0 of the main fork
 * (pool id, tree number, generation), cached in rd_amcache; the record must
 * still carry the index's current storage identity, otherwise the tree is
 * gone (a wiped or foreign pool, pg_upgrade, a restored base backup) and the
 * index must be rebuilt: we say REINDEX instead of returning nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"
#include "amr_wal.h"

#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xloginsert.h"
#include "catalog/dependency.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "catalog/pg_tablespace_d.h"
#include "catalog/storage.h"
#include "commands/dbcommands.h"
#include "commands/tablespace.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/smgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"

typedef enum PendingKind
{
	PENDING_CREATED,			/* free on abort, make VALID on commit */
	PENDING_DROP_TREE,			/* free on commit */
	PENDING_DROP_DATABASE		/* free every tree of the database on commit */
} PendingKind;

typedef struct PendingAction
{
	PendingKind kind;
	uint32		tree_no;
	uint32		generation;
	Oid			db_oid;
	SubTransactionId subid;
	struct PendingAction *next;
} PendingAction;

static PendingAction *pending_actions = NULL;
static object_access_hook_type prev_object_access_hook = NULL;
static ProcessUtility_hook_type prev_process_utility_hook = NULL;

static void
remember(PendingKind kind, uint32 tree_no, uint32 generation, Oid db_oid)
{
	PendingAction *p;

	/* a tree superseded in place and unlinked too is dropped once */
	if (kind == PENDING_DROP_TREE)
		for (p = pending_actions; p; p = p->next)
			if (p->kind == kind && p->tree_no == tree_no && p->generation == generation)
				return;

	p = MemoryContextAlloc(TopTransactionContext, sizeof(PendingAction));
	p->kind = kind;
	p->tree_no = tree_no;
	p->generation = generation;
	p->db_oid = db_oid;
	p->subid = GetCurrentSubTransactionId();
	p->next = pending_actions;
	pending_actions = p;
	if (kind == PENDING_DROP_TREE)
		amr_sync_add(&amr_store.trees[tree_no].drops_pending, 1);
}

static void
persist_u32(uint32 *field, uint32 value)
{
	*field = value;
	amr_persist(field, sizeof(uint32));
}

/* Reset the DRAM descriptor of a tree and return its inner nodes. */
void
amr_tree_reset_dram(AmrTree *t)
{
	uint32		tree_no = t->tree_no;
	uint32		generation = t->generation;

	amr_tree_free_nodes(&amr_store, t);
	amr_tree_descriptor_init(t, tree_no, NULL);
	t->generation = generation;
}

/*
 * Free every leaf of a tree and its record.  The DROPPED state is persisted
 * first, so a crash half-way is finished by the next reconciliation.  Runs in
 * commit and abort callbacks: no ERROR, no palloc.
 */
void
amr_tree_free_storage(uint32 tree_no)
{
	AmrStore   *s = &amr_store;
	AmrTreeRecord *rec = &s->tree_records[tree_no];
	AmrTree    *t = &s->trees[tree_no];
	uint32		generation = rec->generation;
	uint32		id;
	uint64		word;

	if (rec->state == AMR_TREE_FREE)
		return;
	/* WAL first: replay frees the tree even if we crash half-way */
	if (rec->state != AMR_TREE_DROPPED)
		amr_wal_tree_drop(rec);
	persist_u32(&rec->state, AMR_TREE_DROPPED);
	AMR_FAULT_POINT("drop:after_dropped_state");

	/*
	 * publish lock first, as everywhere: amrtree_check sees no half state.
	 * The releases go to a disk pool with one msync (amr_persist_batch_*):
	 * the DROPPED state is durable already, and attach discards whatever is
	 * left of a DROPPED tree, so their order does not matter; the batch ends
	 * before the FREE state is written.
	 */
	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	amr_persist_batch_begin();
	for (id = 0; amr_lt_next_of_tree(s, tree_no, generation, &id, &word); id++)
	{
		LWLockAcquire(amr_leaf_lock(id), LW_EXCLUSIVE);
		amr_leaf_free(t, id);
		LWLockRelease(amr_leaf_lock(id));
	}
	amr_persist_batch_end();
	amr_tree_reset_dram(t);
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);

	AMR_FAULT_POINT("drop:before_free_state");
	LWLockAcquire(&amr_shared->directory_lock, LW_EXCLUSIVE);
	persist_u32(&rec->state, AMR_TREE_FREE);
	LWLockRelease(&amr_shared->directory_lock);
}

void
amr_tree_mark_broken(uint32 tree_no)
{
	AmrTreeRecord *rec = &amr_store.tree_records[tree_no];

	if (rec->flags & AMR_TREE_FLAG_BROKEN)
		return;
	rec->flags |= AMR_TREE_FLAG_BROKEN;
	amr_persist(&rec->flags, sizeof(rec->flags));
}

/* The index's placement options, parsed: budget kind and value, tiering. */
static void
parse_placement_options(Relation index, AmrBudgetKind *kind, double *value, bool *tiering)
{
	AmrOptions *o = (AmrOptions *) index->rd_options;

	*kind = AMR_BUDGET_UNLIMITED;
	*value = 0;
	*tiering = AMR_TIERING_DEFAULT;
	if (o == NULL)
		return;
	if (o->pmem_budget_offset != 0 &&
		amr_parse_budget((const char *) o + o->pmem_budget_offset, kind, value) != AMR_BUDGET_PARSE_OK)
		*kind = AMR_BUDGET_UNLIMITED;	/* a value stored before it was
										 * refused */
	*tiering = o->tiering;
}

/*
 * Mirror the index's placement options into its tree record (persisted,
 * for the tier manager, which cannot read catalogs) and DRAM descriptor, if
 * they changed: ALTER INDEX ... SET takes effect at the next use.
 */
static void
sync_placement(AmrTree *t, AmrBudgetKind kind, double value, bool tiering)
{
	AmrTreeRecord *rec = &amr_store.tree_records[t->tree_no];

	if (rec->budget_kind != (uint32) kind || rec->budget_value != value ||
		rec->tiering_off != (uint32) !tiering)
	{
		rec->budget_kind = kind;
		rec->budget_value = value;
		rec->tiering_off = !tiering;
		amr_persist(&rec->budget_kind, offsetof(AmrTreeRecord, backend_id) -
					offsetof(AmrTreeRecord, budget_kind));
	}
	if (t->budget_kind != (uint32) kind || t->budget_value != value || t->tiering != tiering)
	{
		t->budget_value = value;
		t->budget_kind = kind;
		t->tiering = tiering;
	}
}

static Oid
index_tablespace(Relation index)
{
	return index->rd_node.spcNode;
}

/* The backend owning a tree's storage: InvalidBackendId unless temporary. */
static BackendId
tree_backend(const AmrTreeRecord *rec)
{
	return (rec->flags & AMR_TREE_FLAG_TEMP) ? (BackendId) rec->backend_id : InvalidBackendId;
}

/*
 * Is a live tree record keyed by this storage: database, tablespace,
 * relfilenode, and for a temporary index its backend (temporary
 * relfilenodes are allocated per backend and may equal permanent ones)?
 */
static bool
tree_has_storage(const AmrTreeRecord *rec, Oid db, Oid spc, Oid relfilenode, BackendId backend)
{
	return (rec->state == AMR_TREE_VALID || rec->state == AMR_TREE_BUILDING) &&
		rec->db_oid == db && rec->spc_oid == spc && rec->relfilenode == relfilenode &&
		tree_backend(rec) == backend;
}

uint32
amr_tree_create(Relation index, bool unlogged)
{
	AmrStore   *s = &amr_store;
	TransactionId xid = GetCurrentTransactionId();
	uint32		tree_no = UINT32_MAX;
	uint32		i;
	AmrTreeRecord *rec;
	AmrTree    *t;

	amr_require_ready();

	LWLockAcquire(&amr_shared->directory_lock, LW_EXCLUSIVE);
	for (i = 0; i < AMR_MAX_TREES; i++)
	{
		if (s->tree_records[i].state == AMR_TREE_FREE)
		{
			tree_no = i;
			break;
		}
	}
	if (tree_no == UINT32_MAX)
	{
		LWLockRelease(&amr_shared->directory_lock);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("cannot create amrtree index \"%s\": the PMEM pool already holds %d indexes",
						RelationGetRelationName(index), AMR_MAX_TREES),
				 errhint("Drop unused amrtree indexes.")));
	}

	rec = &s->tree_records[tree_no];
	rec->flags = unlogged ? AMR_TREE_FLAG_UNLOGGED : 0;
	rec->backend_id = (int32) index->rd_backend;
	if (RelationUsesLocalBuffers(index))
		rec->flags |= AMR_TREE_FLAG_TEMP;
	rec->db_oid = MyDatabaseId;
	rec->spc_oid = index_tablespace(index);
	rec->relfilenode = index->rd_node.relNode;
	rec->index_oid = RelationGetRelid(index);
	rec->create_xid = xid;
	rec->generation++;
	rec->create_lsn = amr_insert_lsn();
	amr_persist(rec, sizeof(*rec));
	persist_u32(&rec->state, AMR_TREE_BUILDING);

	t = &s->trees[tree_no];
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	amr_tree_reset_dram(t);
	t->generation = rec->generation;
	LWLockRelease(amr_tree_lock(t));
	{
		AmrBudgetKind kind;
		double		value;
		bool		tiering;

		parse_placement_options(index, &kind, &value, &tiering);
		sync_placement(t, kind, value, tiering);
	}
	(void) amr_wal_tree_create(index, tree_no, rec);

	/*
	 * An older tree of the same storage -- an index rebuilt in place, in the
	 * file it already has, when a table created in this transaction is
	 * truncated (or an ON COMMIT DELETE ROWS table is emptied) -- is
	 * superseded once this transaction commits.  Rebuilds into a new file
	 * (REINDEX, TRUNCATE, VACUUM FULL, CLUSTER) unlink the old one, which
	 * note_storage_drops() sees -- except for temporary indexes, whose
	 * unlinks PostgreSQL keeps to the backend: an older tree of the same
	 * temporary index is superseded here too.
	 */
	for (i = 0; i < AMR_MAX_TREES; i++)
	{
		AmrTreeRecord *old = &s->tree_records[i];

		if (i == tree_no)
			continue;
		if (tree_has_storage(old, MyDatabaseId, rec->spc_oid, rec->relfilenode,
							 tree_backend(rec)) ||
			((rec->flags & AMR_TREE_FLAG_TEMP) && (old->flags & AMR_TREE_FLAG_TEMP) &&
			 (old->state == AMR_TREE_VALID || old->state == AMR_TREE_BUILDING) &&
			 old->db_oid == MyDatabaseId && old->index_oid == rec->index_oid &&
			 old->backend_id == rec->backend_id))
			remember(PENDING_DROP_TREE, i, old->generation, InvalidOid);
	}
	LWLockRelease(&amr_shared->directory_lock);

	remember(PENDING_CREATED, tree_no, rec->generation, InvalidOid);
	return tree_no;
}

/* ---- metapage ---- */

static void
fill_metapage(Page page, uint32 tree_no, Relation index)
{
	AmrMetaPageData *meta;

	PageInit(page, BLCKSZ, 0);
	meta = (AmrMetaPageData *) PageGetContents(page);
	memset(meta, 0, sizeof(*meta));
	meta->magic = AMR_META_MAGIC;
	meta->version = AMR_META_VERSION;
	meta->pool_id = amr_shared->pool_id;
	meta->tree_no = tree_no;
	meta->tree_generation = tree_no < AMR_MAX_TREES ?
		amr_store.tree_records[tree_no].generation : 0;
	meta->db_oid = MyDatabaseId;
	meta->relfilenode = index->rd_node.relNode;
	((PageHeader) page)->pd_lower = ((char *) meta + sizeof(AmrMetaPageData)) - (char *) page;
}

void
amr_metapage_write(Relation index, ForkNumber fork, uint32 tree_no)
{
	if (fork == MAIN_FORKNUM)
	{
		Buffer		buf;
		Page		page;

		buf = ReadBufferExtended(index, MAIN_FORKNUM,
								 RelationGetNumberOfBlocks(index) == 0 ? P_NEW : 0,
								 RBM_NORMAL, NULL);
		LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
		page = BufferGetPage(buf);
		START_CRIT_SECTION();
		fill_metapage(page, tree_no, index);
		MarkBufferDirty(buf);
		if (RelationNeedsWAL(index))
			log_newpage_buffer(buf, true);
		END_CRIT_SECTION();
		UnlockReleaseBuffer(buf);
	}
	else
	{
		PGAlignedBlock block;

		fill_metapage((Page) block.data, tree_no, index);
		PageSetChecksumInplace((Page) block.data, 0);
		if (smgrnblocks(RelationGetSmgr(index), fork) == 0)
			smgrextend(RelationGetSmgr(index), fork, 0, block.data, true);
		else
			smgrwrite(RelationGetSmgr(index), fork, 0, block.data, true);
		log_newpage(&RelationGetSmgr(index)->smgr_rnode.node, fork, 0,
					(Page) block.data, true);
		smgrimmedsync(RelationGetSmgr(index), fork);
	}
}

static void
tree_missing(Relation index, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("amrtree index \"%s\" has no tree in the PMEM pool",
					RelationGetRelationName(index)),
			 errdetail("%s", why),
			 RecoveryInProgress() ?
			 errhint("Copy the primary's pool to this standby (see \"Hot standby\" in the amrtree user guide), or REINDEX INDEX %s on the primary.",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(index)),
												RelationGetRelationName(index))) :
			 !index->rd_index->indisvalid ?
			 errhint("The index is invalid (a CREATE INDEX CONCURRENTLY or REINDEX CONCURRENTLY that failed or is still running), and the background rebuild leaves it alone: drop it, or rebuild it with REINDEX INDEX %s;",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(index)),
												RelationGetRelationName(index))) :
			 amr_auto_rebuild ?
			 errhint("amrtree rebuilds it in the background (see amrtree_index_stats); queries do not use it meanwhile.  To rebuild it now: REINDEX INDEX %s;",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(index)),
												RelationGetRelationName(index))) :
			 errhint("Rebuild it: REINDEX INDEX %s;",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(index)),
												RelationGetRelationName(index)))));
}

/*
 * The live tree keyed by the index's storage: the one the metapage names
 * if it still has that storage and generation (the usual case, also on a
 * standby whose pool is a copy of the primary's), else any live tree with
 * that storage (trees WAL replay created in a pool of the standby's own).
 * UINT32_MAX if none.
 */
static uint32
find_tree_of(Relation index, const AmrMetaPageData *meta)
{
	Oid			spc = index_tablespace(index);
	Oid			relfilenode = index->rd_node.relNode;
	uint32		best = UINT32_MAX;
	uint32		tn;

	if (meta->tree_no < AMR_MAX_TREES)
	{
		AmrTreeRecord *rec = &amr_store.tree_records[meta->tree_no];

		if (rec->generation == meta->tree_generation &&
			tree_has_storage(rec, MyDatabaseId, spc, relfilenode, index->rd_backend))
			return meta->tree_no;
	}
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &amr_store.tree_records[tn];

		/* of two (one superseded in place), the newer one */
		if (tree_has_storage(rec, MyDatabaseId, spc, relfilenode, index->rd_backend) &&
			(best == UINT32_MAX || rec->create_lsn > amr_store.tree_records[best].create_lsn))
			best = tn;
	}
	return best;
}

static void
tree_broken(Relation index)
{
	ereport(ERROR,
			(errcode(ERRCODE_INDEX_CORRUPTED),
			 errmsg("amrtree index \"%s\" cannot be used on this server",
					RelationGetRelationName(index)),
			 errdetail("WAL replay could not keep its tree up to date; the server log says why."),
			 errhint("REINDEX INDEX %s on the primary (a standby follows), or on this server once it is promoted.",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(index)),
												RelationGetRelationName(index)))));
}

/*
 * The tree of an index, or NULL (missing_ok only) with *state saying why:
 * see amr_tree_lookup.
 */
static AmrTree *
tree_open(Relation index, bool missing_ok, AmrTreeUse *state)
{
	AmrRelCache *cache = (AmrRelCache *) index->rd_amcache;
	AmrTreeRecord *rec;
	AmrTree    *t;

	amr_require_ready();

	if (cache == NULL)
	{
		Buffer		buf;
		AmrMetaPageData meta;
		uint32		tree_no;

		if (RelationGetNumberOfBlocks(index) == 0)
		{
			*state = AMR_USE_LOST;
			if (missing_ok)
				return NULL;
			tree_missing(index, "The index has no metapage.");
		}
		buf = ReadBuffer(index, 0);
		LockBuffer(buf, BUFFER_LOCK_SHARE);
		memcpy(&meta, PageGetContents(BufferGetPage(buf)), sizeof(meta));
		UnlockReleaseBuffer(buf);

		if (meta.magic != AMR_META_MAGIC || meta.version != AMR_META_VERSION)
			ereport(ERROR,
					(errcode(ERRCODE_INDEX_CORRUPTED),
					 errmsg("index \"%s\" is not an amrtree index or its metapage is damaged",
							RelationGetRelationName(index)),
					 amr_errhint_reindex()));
		tree_no = find_tree_of(index, &meta);
		if (tree_no == UINT32_MAX)
		{
			*state = AMR_USE_LOST;
			if (missing_ok)
				return NULL;
			if (meta.pool_id != amr_shared->pool_id)
				tree_missing(index, "The index was built in another PMEM pool: this server's pool was not copied from the server that built it (it was replaced, or lies outside the data directory that a base backup copied).");
			tree_missing(index, "The tree recorded in the metapage was dropped or belongs to other storage.");
		}

		cache = MemoryContextAlloc(index->rd_indexcxt, sizeof(AmrRelCache));
		cache->tree_no = tree_no;
		cache->generation = amr_store.tree_records[tree_no].generation;
		parse_placement_options(index, &cache->budget_kind, &cache->budget_value,
								&cache->tiering);
		index->rd_amcache = cache;
	}

	rec = &amr_store.tree_records[cache->tree_no];
	if (rec->generation != cache->generation ||
		!tree_has_storage(rec, MyDatabaseId, index_tablespace(index), index->rd_node.relNode,
						  index->rd_backend))
	{
		/*
		 * replaced since we cached it (a standby replaying a rebuild): look
		 * again
		 */
		index->rd_amcache = NULL;
		pfree(cache);
		return tree_open(index, missing_ok, state);
	}
	if (rec->flags & AMR_TREE_FLAG_BROKEN)
	{
		*state = AMR_USE_DAMAGED;
		if (missing_ok)
			return NULL;
		tree_broken(index);
	}
	t = &amr_store.trees[cache->tree_no];

	amr_tree_pack_if_stale(t);
	/* on a standby placement is replay's business: nothing is written */
	if (!RecoveryInProgress())
		sync_placement(t, cache->budget_kind, cache->budget_value, cache->tiering);
	*state = AMR_USE_OK;
	return t;
}

/*
 * WAL replay leaves a tree's inner nodes to be packed at its first use when
 * it publishes leaves they do not hold (a build, a split it could not link,
 * a leaf taken back): pack them now.  amr_tree_open calls this, and scans
 * call it again whenever they find the nodes stale under their shared lock
 * (amr_scan.c, lock_tree_for_read): replay may have done that after the
 * tree was opened, and leaves missing from the inner nodes are missing from
 * the scan.  (amrtree_check packs under the exclusive lock it already holds;
 * the planner's leaf count may read stale nodes, which only skews it.)
 */
void
amr_tree_pack_if_stale(AmrTree *t)
{
	if (!t->inner_stale)
		return;

	/*
	 * Publish lock first, as everywhere that allocates or frees inner nodes:
	 * the pool-wide part of amrtree_check counts the allocated nodes against
	 * the trees' counts under it in exclusive mode, and a repack frees the
	 * tree's nodes and allocates all new ones before it counts them: a check
	 * that ran while the first uses after a crash packed the trees reported
	 * the index as corrupted ("N inner nodes are allocated but the trees hold
	 * M").
	 */
	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	if (t->inner_stale)
		amr_tree_rebuild_inner(t);
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);
}

AmrTree *
amr_tree_open_extended(Relation index, bool missing_ok)
{
	AmrTreeUse	state;

	return tree_open(index, missing_ok, &state);
}

AmrTree *
amr_tree_open(Relation index)
{
	AmrTreeUse	state;

	return tree_open(index, false, &state);
}

/*
 * The tree of an index and what this server has for it: USABLE (the tree
 * is returned), LOST (no tree: the pool it was built in is gone, or its
 * tree was dropped -- none can reappear for this storage, so the index
 * can only be rebuilt) or DAMAGED (WAL replay gave up on it).  Raises only
 * when the pool itself cannot be used or the metapage is not amrtree's.
 */
AmrTree *
amr_tree_lookup(Relation index, AmrTreeUse *state)
{
	return tree_open(index, true, state);
}

/* ---- drops ---- */

/*
 * The drop of a temporary amrtree index: PostgreSQL does not list the
 * unlinks of temporary relations at commit (they are the backend's own), but
 * no other session can be scanning the index, so the drop hook is the right
 * moment to remember it.  Also when the index belongs to another backend's
 * temporary schema, which this backend or autovacuum cleans up.
 */
static void
remember_drop_of_temp_index(Oid indexoid)
{
	HeapTuple	tup;
	Form_pg_class cls;
	Oid			am = get_index_am_oid("amrtree", true);
	Oid			spc;
	Oid			relfilenode;
	BackendId	backend;
	uint32		tn;

	if (!OidIsValid(am))
		return;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(indexoid));
	if (!HeapTupleIsValid(tup))
		return;
	cls = (Form_pg_class) GETSTRUCT(tup);
	if (cls->relkind != RELKIND_INDEX || cls->relam != am ||
		cls->relpersistence != RELPERSISTENCE_TEMP)
	{
		ReleaseSysCache(tup);
		return;
	}
	spc = OidIsValid(cls->reltablespace) ? cls->reltablespace : MyDatabaseTableSpace;
	relfilenode = cls->relfilenode;
	backend = GetTempNamespaceBackendId(cls->relnamespace);
	ReleaseSysCache(tup);

	LWLockAcquire(&amr_shared->directory_lock, LW_SHARED);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &amr_store.tree_records[tn];

		if (tree_has_storage(rec, MyDatabaseId, spc, relfilenode, backend))
			remember(PENDING_DROP_TREE, tn, rec->generation, InvalidOid);
	}
	LWLockRelease(&amr_shared->directory_lock);
}

static void
amr_object_access(ObjectAccessType access, Oid classId, Oid objectId,
				  int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);

	if (access == OAT_DROP && classId == RelationRelationId && subId == 0 &&
		amr_is_reconciled())
		remember_drop_of_temp_index(objectId);

	/* a rebuild worker's REINDEX CONCURRENTLY creating its new copy */
	if (access == OAT_POST_CREATE && classId == RelationRelationId && subId == 0)
		amr_heal_note_created(objectId);

	/*
	 * Permanent relations: see note_storage_drops().  Before the first
	 * reconciliation of this server's life nothing is freed here: it will
	 * find the database's directory gone and reclaim its trees as orphans
	 * (and it drops every temporary tree).
	 */
	if (access == OAT_DROP && classId == DatabaseRelationId && amr_is_reconciled())
		remember(PENDING_DROP_DATABASE, 0, 0, objectId);
}

static void
drop_database_trees(Oid db_oid)
{
	uint32		i;

	for (i = 0; i < AMR_MAX_TREES; i++)
	{
		AmrTreeRecord *rec = &amr_store.tree_records[i];

		if (rec->state != AMR_TREE_FREE && rec->db_oid == db_oid)
			amr_tree_free_storage(i);
	}
}

/*
 * Just before commit: the trees whose relation file this transaction
 * unlinks at commit are dropped with it.  Returns whether there are any.
 * Only once this server's reconciliation has run (the DRAM state it frees
 * into exists then); a drop before that is found by the reconciliation,
 * which takes a tree whose file is gone or empty for an orphan.
 * Runs before the commit record is written, so it may raise an ERROR; the
 * pending drop counts keep amrtree_check from taking these trees for
 * orphans between the commit and the callback that frees them.
 */
static bool
note_storage_drops(void)
{
	RelFileNode *rels;
	int			nrels = smgrGetPendingDeletes(true, &rels);
	bool		found = false;
	int			i;

	if (nrels == 0)
		return false;
	LWLockAcquire(&amr_shared->directory_lock, LW_SHARED);
	for (i = 0; i < nrels; i++)
	{
		uint32		tn;

		for (tn = 0; tn < AMR_MAX_TREES; tn++)
		{
			AmrTreeRecord *rec = &amr_store.tree_records[tn];

			/* PostgreSQL lists no temporary relation here */
			if (tree_has_storage(rec, rels[i].dbNode, rels[i].spcNode, rels[i].relNode,
								 InvalidBackendId))
			{
				remember(PENDING_DROP_TREE, tn, rec->generation, InvalidOid);
				found = true;
			}
		}
	}
	LWLockRelease(&amr_shared->directory_lock);
	pfree(rels);
	return found;
}

static bool
tree_still_ours(const PendingAction *p)
{
	AmrTreeRecord *rec = &amr_store.tree_records[p->tree_no];

	return rec->state != AMR_TREE_FREE && rec->generation == p->generation;
}

static void
apply_commit(void)
{
	PendingAction *p;

	/*
	 * Act only on a durable commit: with synchronous_commit = off a crash
	 * could still undo this one, and a tree made VALID (or storage freed) for
	 * a transaction that recovery then rolls back would leak (or lose) an
	 * index.  DDL is rare; one flush is cheap.
	 */
	if (!XLogRecPtrIsInvalid(XactLastCommitEnd))
		XLogFlush(XactLastCommitEnd);
	AMR_FAULT_POINT("commit:before_apply");

	/* drops first: a tree created and superseded in one transaction goes */
	for (p = pending_actions; p; p = p->next)
	{
		if (p->kind == PENDING_DROP_TREE && tree_still_ours(p))
			amr_tree_free_storage(p->tree_no);
		else if (p->kind == PENDING_DROP_DATABASE)
			drop_database_trees(p->db_oid);
	}
	for (p = pending_actions; p; p = p->next)
	{
		if (p->kind == PENDING_CREATED && tree_still_ours(p))
		{
			AmrTreeRecord *rec = &amr_store.tree_records[p->tree_no];

			if (rec->state == AMR_TREE_BUILDING)
			{
				AMR_FAULT_POINT("create:before_valid");
				persist_u32(&rec->state, AMR_TREE_VALID);
			}
		}
	}
}

static void
apply_abort(SubTransactionId from_subid)
{
	PendingAction **link = &pending_actions;

	while (*link)
	{
		PendingAction *p = *link;

		if (from_subid != InvalidSubTransactionId && p->subid < from_subid)
		{
			link = &p->next;
			continue;
		}
		if (p->kind == PENDING_CREATED && tree_still_ours(p))
			amr_tree_free_storage(p->tree_no);
		else if (p->kind == PENDING_DROP_TREE && tree_still_ours(p))
			amr_sync_sub(&amr_store.trees[p->tree_no].drops_pending, 1);
		*link = p->next;
	}
}

static void
amr_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			amr_wb_pre_commit();
			if (amr_is_reconciled())
				(void) note_storage_drops();
			break;
		case XACT_EVENT_PRE_PREPARE:
			amr_wb_pre_commit();
			if (amr_is_reconciled())
				(void) note_storage_drops();
			if (pending_actions != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that created or dropped an amrtree index")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			amr_wb_end_of_xact();
			if (pending_actions != NULL && amr_shared != NULL)
				apply_commit();
			pending_actions = NULL;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			amr_wb_end_of_xact();
			if (pending_actions != NULL && amr_shared != NULL)
				apply_abort(InvalidSubTransactionId);
			pending_actions = NULL;
			break;
		case XACT_EVENT_PREPARE:
			amr_wb_end_of_xact();
			break;
		default:
			break;
	}
}

static void
amr_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	PendingAction *p;

	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			for (p = pending_actions; p; p = p->next)
				if (p->subid == mySubid)
					p->subid = parentSubid;
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			if (amr_shared != NULL)
				apply_abort(mySubid);
			break;
		default:
			break;
	}
}

/* ---- tablespace moves ---- */

/*
 * ALTER INDEX ... SET TABLESPACE and ALTER DATABASE ... SET TABLESPACE copy
 * an index's files to new storage without calling the access method, so
 * the tree would be left keyed by the old storage, and a restart would take
 * it for an orphan.  REINDEX (TABLESPACE ...) rebuilds the tree where it
 * should be; we point there instead.
 */
/* A tablespace as pg_class.reltablespace names it: 0 for the database's default. */
static Oid
stored_tablespace(Oid spc)
{
	return spc == MyDatabaseTableSpace ? InvalidOid : spc;
}

static void
refuse_index_move(Oid indexoid, const char *new_tablespace)
{
	HeapTuple	tup;
	Form_pg_class cls;
	Oid			am = get_index_am_oid("amrtree", true);
	Oid			target;

	if (!OidIsValid(am) || !OidIsValid(indexoid))
		return;
	/* a tablespace that does not exist: PostgreSQL says so itself */
	target = get_tablespace_oid(new_tablespace, true);
	if (!OidIsValid(target))
		return;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(indexoid));
	if (!HeapTupleIsValid(tup))
		return;
	cls = (Form_pg_class) GETSTRUCT(tup);
	/* to where it already is: a no-op for PostgreSQL, and so for us */
	if (cls->relkind == RELKIND_INDEX && cls->relam == am &&
		stored_tablespace(target) != cls->reltablespace)
	{
		char	   *name = quote_qualified_identifier(get_namespace_name(cls->relnamespace),
													  NameStr(cls->relname));

		ReleaseSysCache(tup);
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("amrtree index %s cannot be moved to another tablespace by copying its files", name),
				 errdetail("Its leaves live in the amrtree pool, keyed by the index's storage."),
				 errhint("Rebuild it in the new tablespace: REINDEX (TABLESPACE new_tablespace) INDEX %s;",
						 name)));
	}
	ReleaseSysCache(tup);
}

static bool
database_has_trees(Oid db_oid, Oid spc_oid)
{
	uint32		i;

	for (i = 0; i < AMR_MAX_TREES; i++)
	{
		AmrTreeRecord *rec = &amr_store.tree_records[i];

		if ((rec->state == AMR_TREE_VALID || rec->state == AMR_TREE_BUILDING) &&
			rec->db_oid == db_oid && (!OidIsValid(spc_oid) || rec->spc_oid == spc_oid))
			return true;
	}
	return false;
}

static void
amr_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					ProcessUtilityContext context, ParamListInfo params,
					QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;

	if (amr_is_ready())
	{
		if (IsA(parsetree, AlterTableStmt))
		{
			AlterTableStmt *stmt = (AlterTableStmt *) parsetree;
			ListCell   *lc;

			foreach(lc, stmt->cmds)
			{
				AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

				if (cmd->subtype == AT_SetTableSpace)
					refuse_index_move(RangeVarGetRelid(stmt->relation, NoLock, true), cmd->name);
			}
		}
		else if (IsA(parsetree, AlterTableMoveAllStmt))
		{
			AlterTableMoveAllStmt *stmt = (AlterTableMoveAllStmt *) parsetree;
			Oid			from = get_tablespace_oid(stmt->orig_tablespacename, true);
			Oid			to = get_tablespace_oid(stmt->new_tablespacename, true);

			if (stmt->objtype == OBJECT_INDEX && from != to &&
				database_has_trees(MyDatabaseId,
								   from == InvalidOid || from == DEFAULTTABLESPACE_OID ?
								   MyDatabaseTableSpace : from))
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("amrtree indexes cannot be moved to another tablespace by copying their files"),
						 errhint("Rebuild them in the new tablespace with REINDEX (TABLESPACE ...), or move the other indexes one by one.")));
		}
		else if (IsA(parsetree, AlterDatabaseStmt))
		{
			AlterDatabaseStmt *stmt = (AlterDatabaseStmt *) parsetree;
			ListCell   *lc;

			foreach(lc, stmt->options)
			{
				DefElem    *opt = lfirst_node(DefElem, lc);
				Oid			db = get_database_oid(stmt->dbname, true);

				if (strcmp(opt->defname, "tablespace") == 0 && OidIsValid(db) &&
					database_has_trees(db, InvalidOid))
					ereport(ERROR,
							(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
							 errmsg("database \"%s\" has amrtree indexes, which ALTER DATABASE SET TABLESPACE cannot move",
									stmt->dbname),
							 errhint("Drop its amrtree indexes, move the database, and create them again.")));
			}
		}
	}

	if (prev_process_utility_hook)
		prev_process_utility_hook(pstmt, queryString, readOnlyTree, context, params,
								  queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);
}

void
amr_directory_register_hooks(void)
{
	prev_process_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = amr_process_utility;
	prev_object_access_hook = object_access_hook;
	object_access_hook = amr_object_access;
	RegisterXactCallback(amr_xact_callback, NULL);
	RegisterSubXactCallback(amr_subxact_callback, NULL);
}
