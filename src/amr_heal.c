/*-------------------------------------------------------------------------
 *
 * amr_heal.c
 *		An index whose tree is gone never takes the application down, and
 *		comes back by itself.
 *
 * A tree is LOST when the pool it lived in is gone (a reboot cleared
 * /dev/shm, the pool file was deleted, a restore left it behind) or was
 * replaced, and DAMAGED when WAL replay gave up on it.  Neither state can
 * revert: a tree is keyed by the index's storage (relfilenode), and only
 * a build -- which gives the index new storage -- makes one.  So:
 *
 *	plan	  the planner never sees such an index: get_relation_info_hook
 *			  removes it from the relation's index list (amcostestimate
 *			  could only make it expensive, and a plan with no alternative,
 *			  enable_seqscan = off say, would still choose it and fail);
 *	write	  aminsert skips it (the rebuild reads the heap anyway), VACUUM
 *			  has nothing to clean in it;
 *	heal	  the backend that notices asks for a rebuild of its database;
 *			  the tier manager launches one "amrtree rebuild" worker at a
 *			  time, which connects to that database and runs REINDEX INDEX
 *			  CONCURRENTLY on every amrtree index there without a usable
 *			  tree: the new index is built and catches up with concurrent
 *			  writes the way CREATE INDEX CONCURRENTLY does, then replaces
 *			  the old one, and pg_stat_progress_create_index shows it.
 *
 * When the pool was created at this start, or replay damaged trees, every
 * database is visited once, so that an index nobody touches is rebuilt too.
 * amrtree.auto_rebuild = off keeps the first two steps and leaves the
 * rebuild to the administrator (the error hints say how).  A standby never
 * rebuilds (it cannot write); its planner skips such indexes.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_database.h"
#include "catalog/pg_index.h"
#include "commands/defrem.h"
#include "commands/tablecmds.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/value.h"
#include "optimizer/plancat.h"
#include "parser/parse_node.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

bool		amr_auto_rebuild = AMR_AUTO_REBUILD_DEFAULT;

/* the wait before the next run after a failed one: doubles, up to the max */
#define AMR_HEAL_RETRY_MIN_S	30
#define AMR_HEAL_RETRY_MAX_S	3600

static get_relation_info_hook_type prev_get_relation_info_hook = NULL;

/* the tier manager's handle on the rebuild worker it launched */
static BackgroundWorkerHandle *rebuild_worker = NULL;

/*
 * A rebuild worker notes the relations its REINDEX CONCURRENTLY creates
 * (the new copy of the index), so that a failed rebuild can drop what it
 * left behind.  One REINDEX of one index creates one index.
 */
#define AMR_HEAL_MAX_CREATED	4
static bool rebuild_noting = false;
static Oid	rebuild_created[AMR_HEAL_MAX_CREATED];
static int	rebuild_ncreated = 0;

/* ---- requests ---- */

/* Ask for a rebuild of the lost trees of database dbid (any process). */
void
amr_heal_request(Oid dbid)
{
	AmrHealQueue *q;
	int			i;
	bool		queued = false;

	if (amr_shared == NULL || RecoveryInProgress())
		return;
	q = &amr_shared->heal;
	SpinLockAcquire(&q->mutex);
	for (i = 0; i < q->ndbs; i++)
		if (q->dbs[i] == dbid)
			queued = true;
	if (!queued && q->ndbs < AMR_HEAL_MAX_DBS)
		q->dbs[q->ndbs++] = dbid;
	else if (!queued)
		q->all_databases = true;	/* overflow: visit them all */
	SpinLockRelease(&q->mutex);
	if (!queued && q->tier_manager_latch != NULL)
		SetLatch(q->tier_manager_latch);
}

/* Ask for a visit of every database (pool created, trees damaged). */
void
amr_heal_request_all(void)
{
	AmrHealQueue *q = &amr_shared->heal;

	SpinLockAcquire(&q->mutex);
	q->all_databases = true;
	SpinLockRelease(&q->mutex);
	if (q->tier_manager_latch != NULL)
		SetLatch(q->tier_manager_latch);
}

/*
 * Does this server lack a usable tree for the index?  Never raises for a
 * missing tree; an unusable pool counts as lacking (and is reported by
 * whatever touches the index).
 */
static bool
index_lacks_tree(Relation index, AmrTreeUse *state)
{
	*state = AMR_USE_LOST;
	if (!amr_is_ready())
		return true;
	return amr_tree_lookup(index, state) == NULL;
}

/* ---- plan ---- */

/*
 * Remove amrtree indexes that have no usable tree from the candidates of a
 * relation, and ask for their rebuild.
 */
static void
amr_get_relation_info(PlannerInfo *root, Oid relationObjectId, bool inhparent,
					  RelOptInfo *rel)
{
	ListCell   *lc;

	if (prev_get_relation_info_hook)
		prev_get_relation_info_hook(root, relationObjectId, inhparent, rel);
	if (!amr_preloaded || amr_shared == NULL)
		return;

	foreach(lc, rel->indexlist)
	{
		IndexOptInfo *info = (IndexOptInfo *) lfirst(lc);
		Relation	index;
		AmrTreeUse	state;
		bool		lacks;

		if (info->amcostestimate != amrcostestimate)
			continue;
		/* the planner holds a lock on every index it lists */
		index = index_open(info->indexoid, NoLock);
		lacks = index_lacks_tree(index, &state);
		index_close(index, NoLock);
		if (!lacks)
			continue;
		rel->indexlist = foreach_delete_current(rel->indexlist, lc);
		if (amr_is_ready())
			amr_heal_request(MyDatabaseId);
	}
}

/* Install the planner hook (_PG_init). */
void
amr_heal_register_hooks(void)
{
	prev_get_relation_info_hook = get_relation_info_hook;
	get_relation_info_hook = amr_get_relation_info;
}

/* ---- write ---- */

/*
 * The tree an insert or VACUUM works on, or NULL when the index has none
 * (LOST or DAMAGED): the caller skips the index, whose rebuild reads the
 * heap, and the rebuild is requested.  Raises when the pool is unusable:
 * then the tree may well exist, and skipping would lose entries.
 */
AmrTree *
amr_tree_open_for_write(Relation index)
{
	AmrTreeUse	state;
	AmrTree    *t;

	amr_require_ready();
	t = amr_tree_lookup(index, &state);
	if (t == NULL)
		amr_heal_request(MyDatabaseId);
	return t;
}

/* ---- heal: the launcher (in the tier manager) ---- */

/* The databases a visit of all must cover (a transaction is open). */
static List *
all_databases(void)
{
	List	   *dbs = NIL;
	Relation	rel = table_open(DatabaseRelationId, AccessShareLock);
	TableScanDesc scan = table_beginscan_catalog(rel, 0, NULL);
	HeapTuple	tup;

	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (db->datallowconn && db->datconnlimit != DATCONNLIMIT_INVALID_DB)
			dbs = lappend_oid(dbs, db->oid);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	return dbs;
}

static bool
launch_rebuild_worker(Oid dbid)
{
	BackgroundWorker worker;
	MemoryContext old;
	bool		launched;

	memset(&worker, 0, sizeof(worker));
	snprintf(worker.bgw_name, BGW_MAXLEN, "amrtree rebuild in database %u", dbid);
	snprintf(worker.bgw_type, BGW_MAXLEN, "amrtree rebuild");
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "amrtree");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "amr_rebuild_worker_main");
	worker.bgw_main_arg = ObjectIdGetDatum(dbid);
	worker.bgw_notify_pid = MyProcPid;
	/* the handle outlives the tier manager's per-cycle memory */
	old = MemoryContextSwitchTo(TopMemoryContext);
	launched = RegisterDynamicBackgroundWorker(&worker, &rebuild_worker);
	MemoryContextSwitchTo(old);
	if (!launched)
		rebuild_worker = NULL;
	return launched;
}

/*
 * Launch the rebuild of the next requested database, unless one runs
 * (called by the tier manager each cycle; it is connected to no database,
 * which lets it read pg_database for a visit of all).
 */
void
amr_heal_launch_pending(void)
{
	AmrHealQueue *q = &amr_shared->heal;
	pid_t		pid;
	bool		all;
	bool		waiting;
	TimestampTz now;
	Oid			dbid = InvalidOid;

	q->tier_manager_latch = MyLatch;
	if (rebuild_worker != NULL)
	{
		if (GetBackgroundWorkerPid(rebuild_worker, &pid) != BGWH_STOPPED)
			return;
		pfree(rebuild_worker);
		rebuild_worker = NULL;
	}

	/*
	 * Not under pg_upgrade: its indexes have no tree on purpose (amrbuild),
	 * and a REINDEX would give them storage that pg_upgrade does not expect.
	 * They are rebuilt once the upgraded server runs.
	 */
	if (!amr_auto_rebuild || RecoveryInProgress() || IsBinaryUpgrade)
		return;
	/* after a failed run, wait (the requests are kept meanwhile) */
	now = GetCurrentTimestamp();
	SpinLockAcquire(&q->mutex);
	waiting = now < q->retry_after;
	SpinLockRelease(&q->mutex);
	if (waiting)
		return;

	SpinLockAcquire(&q->mutex);
	all = q->all_databases;
	q->all_databases = false;
	SpinLockRelease(&q->mutex);
	if (all)
	{
		MemoryContext cxt = CurrentMemoryContext;
		MemoryContext old;
		List	   *dbs;
		ListCell   *lc;

		StartTransactionCommand();
		/* the list outlives the transaction */
		old = MemoryContextSwitchTo(cxt);
		dbs = all_databases();
		MemoryContextSwitchTo(old);
		CommitTransactionCommand();
		MemoryContextSwitchTo(cxt);
		foreach(lc, dbs)
			amr_heal_request(lfirst_oid(lc));
	}

	SpinLockAcquire(&q->mutex);
	if (q->ndbs > 0)
	{
		dbid = q->dbs[0];
		memmove(&q->dbs[0], &q->dbs[1], sizeof(Oid) * (q->ndbs - 1));
		q->ndbs--;
	}
	SpinLockRelease(&q->mutex);
	if (!OidIsValid(dbid))
		return;
	if (!launch_rebuild_worker(dbid))
	{
		ereport(LOG,
				(errmsg("amrtree: could not start a worker to rebuild indexes that lost their tree"),
				 errhint("Raise max_worker_processes; amrtree tries again at its next pass.")));
		amr_heal_request(dbid);
	}
}

/* ---- heal: the rebuild worker ---- */

/* amrtree indexes of this database that lack a usable tree (in a transaction). */
static List *
indexes_lacking_tree(void)
{
	List	   *result = NIL;
	Oid			amoid = get_am_oid("amrtree", true);
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	if (!OidIsValid(amoid))
		return NIL;				/* amrtree is not installed here */
	rel = table_open(RelationRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_class cls = (Form_pg_class) GETSTRUCT(tup);
		Relation	index;
		AmrTreeUse	state;

		CHECK_FOR_INTERRUPTS();
		if (cls->relam != amoid || cls->relkind != RELKIND_INDEX ||
			cls->relpersistence == RELPERSISTENCE_TEMP)
			continue;
		index = try_relation_open(cls->oid, AccessShareLock);
		if (index == NULL)
			continue;
		/* a leftover of a failed concurrent build is not worth rebuilding */
		if (index->rd_index->indisvalid && index->rd_index->indislive &&
			index_lacks_tree(index, &state))
			result = lappend_oid(result, cls->oid);
		relation_close(index, AccessShareLock);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	return result;
}

/*
 * In a PG_CATCH of a command the worker runs as a top-level statement would:
 * log the error and abort its transaction, back in the worker's context.
 */
static void
abort_after_error(MemoryContext cxt)
{
	MemoryContextSwitchTo(cxt);
	HOLD_INTERRUPTS();
	EmitErrorReport();
	FlushErrorState();
	AbortCurrentTransaction();
	RESUME_INTERRUPTS();
}

/* Object access hook: see rebuild_created. */
void
amr_heal_note_created(Oid relid)
{
	if (rebuild_noting && rebuild_ncreated < AMR_HEAL_MAX_CREATED)
		rebuild_created[rebuild_ncreated++] = relid;
}

/*
 * After a failed REINDEX CONCURRENTLY: drop indexoid, concurrently, as an
 * administrator would by hand, if it is an invalid index of the table
 * heapoid.  The caller passes only what its rebuild created and the index
 * it rebuilt, so this drops the invalid "_ccnew" copy a failure leaves (or
 * the old index, "_ccold", if the failure came after the swap) and nothing
 * else; the next run would leave another copy beside it.  A failure to drop
 * is logged and leaves the index to the administrator.
 */
static void
drop_if_left_invalid(Oid indexoid, Oid heapoid)
{
	MemoryContext cxt = CurrentMemoryContext;
	char	   *nspname = NULL;
	char	   *relname = NULL;
	bool		dropped = false;
	HeapTuple	tup;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(indexoid));
	if (HeapTupleIsValid(tup))
	{
		Form_pg_index idx = (Form_pg_index) GETSTRUCT(tup);

		if (idx->indrelid == heapoid && !idx->indisvalid)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			nspname = get_namespace_name(get_rel_namespace(indexoid));
			relname = get_rel_name(indexoid);
			MemoryContextSwitchTo(old);
		}
		ReleaseSysCache(tup);
	}
	if (nspname == NULL || relname == NULL)
	{
		PopActiveSnapshot();
		CommitTransactionCommand();
		return;
	}
	pgstat_report_activity(STATE_RUNNING, psprintf("DROP INDEX CONCURRENTLY %s",
												   quote_qualified_identifier(nspname, relname)));
	PG_TRY();
	{
		DropStmt   *stmt;

		/*
		 * In the worker's context, as a client's statement runs in its
		 * portal's: the concurrent drop commits the transaction it started
		 * in, and RemoveRelations still uses what it allocated before that.
		 */
		MemoryContextSwitchTo(cxt);
		stmt = makeNode(DropStmt);
		stmt->removeType = OBJECT_INDEX;
		stmt->objects = list_make1(list_make2(makeString(nspname), makeString(relname)));
		stmt->behavior = DROP_RESTRICT;
		stmt->missing_ok = true;
		stmt->concurrent = true;
		RemoveRelations(stmt);
		if (ActiveSnapshotSet())
			PopActiveSnapshot();
		CommitTransactionCommand();
		dropped = true;
	}
	PG_CATCH();
	{
		abort_after_error(cxt);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (dropped)
		ereport(LOG,
				(errmsg("amrtree: dropped index \"%s.%s\", which a failed rebuild left invalid",
						nspname, relname)));
	else
		ereport(LOG,
				(errmsg("amrtree: could not drop index \"%s.%s\", which a failed rebuild left invalid",
						nspname, relname),
				 errhint("The error above says why; drop it with DROP INDEX CONCURRENTLY %s.",
						 quote_qualified_identifier(nspname, relname))));
}

/*
 * Is name what REINDEX CONCURRENTLY calls its copy of the index "orig"
 * ("orig_ccnew", then "orig_ccnew1", ... if taken; orig shortened to fit)?
 */
static bool
is_copy_name(const char *name, const char *orig)
{
	int			n;

	for (n = 0; n < 1000; n++)
	{
		char		label[NAMEDATALEN];
		char	   *candidate;
		bool		same;

		if (n == 0)
			strlcpy(label, "ccnew", sizeof(label));
		else
			snprintf(label, sizeof(label), "ccnew%d", n);
		candidate = makeObjectName(orig, NULL, label);
		same = strcmp(name, candidate) == 0;
		pfree(candidate);
		if (same)
			return true;
	}
	return false;
}

/*
 * The invalid copies of index that earlier rebuilds left when they were
 * stopped before they could drop them (a worker terminated, a shutdown):
 * invalid indexes of the same table named as REINDEX CONCURRENTLY names
 * its copy of this one.  Only while no one builds an index of the table
 * concurrently: such a build holds the lock tried here for as long as its
 * own copy is invalid.  The lock is kept to the end of the transaction.
 * Returns their OIDs, allocated in cxt.
 */
static List *
leftover_copies(Relation index, MemoryContext cxt)
{
	Oid			heapoid = index->rd_index->indrelid;
	Relation	heap;
	List	   *indexes;
	ListCell   *lc;
	List	   *result = NIL;

	if (!ConditionalLockRelationOid(heapoid, ShareUpdateExclusiveLock))
		return NIL;
	heap = table_open(heapoid, NoLock);
	indexes = RelationGetIndexList(heap);
	table_close(heap, NoLock);
	foreach(lc, indexes)
	{
		Oid			oid = lfirst_oid(lc);
		HeapTuple	tup;
		bool		invalid;
		char	   *name;

		if (oid == RelationGetRelid(index))
			continue;
		tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(oid));
		if (!HeapTupleIsValid(tup))
			continue;
		invalid = !((Form_pg_index) GETSTRUCT(tup))->indisvalid;
		ReleaseSysCache(tup);
		if (invalid && (name = get_rel_name(oid)) != NULL &&
			is_copy_name(name, RelationGetRelationName(index)))
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			result = lappend_oid(result, oid);
			MemoryContextSwitchTo(old);
		}
	}
	list_free(indexes);
	return result;
}

/*
 * REINDEX INDEX CONCURRENTLY, as a client's top-level statement would run
 * it (it commits and starts transactions of its own); a plain REINDEX
 * where PostgreSQL refuses the concurrent one (exclusion constraints).
 * Returns false, having reported why, when it failed.
 */
static bool
rebuild_one(Oid indexoid)
{
	MemoryContext cxt = CurrentMemoryContext;
	char	   *nspname = NULL;
	char	   *relname = NULL;
	Oid			heapoid = InvalidOid;
	List	   *leftovers = NIL;
	ListCell   *lc;
	bool		concurrently = true;
	bool		done = false;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	{
		Relation	index = try_relation_open(indexoid, AccessShareLock);
		AmrTreeUse	state;

		if (index != NULL && index_lacks_tree(index, &state))
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			nspname = get_namespace_name(RelationGetNamespace(index));
			relname = pstrdup(RelationGetRelationName(index));
			heapoid = index->rd_index->indrelid;
			concurrently = !index->rd_index->indisexclusion;
			MemoryContextSwitchTo(old);
			if (concurrently)
				leftovers = leftover_copies(index, cxt);
		}
		if (index != NULL)
			relation_close(index, AccessShareLock);
	}
	if (relname == NULL)
	{
		/* dropped, or rebuilt by someone else meanwhile */
		PopActiveSnapshot();
		CommitTransactionCommand();
		return true;
	}
	if (leftovers != NIL)
	{
		/* each drop runs in transactions of its own */
		PopActiveSnapshot();
		CommitTransactionCommand();
		MemoryContextSwitchTo(cxt);
		foreach(lc, leftovers)
			drop_if_left_invalid(lfirst_oid(lc), heapoid);
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
	}
	ereport(LOG,
			(errmsg("amrtree: rebuilding index \"%s.%s\", which has no tree in this server's pool",
					nspname, relname),
			 errdetail("%s", concurrently ?
					   "REINDEX INDEX CONCURRENTLY: the table stays readable and writable." :
					   "REINDEX INDEX: PostgreSQL cannot rebuild an exclusion constraint's index concurrently; writes to the table wait.")));
	pgstat_report_activity(STATE_RUNNING, psprintf("REINDEX INDEX %s%s", concurrently ? "CONCURRENTLY " : "",
												   quote_qualified_identifier(nspname, relname)));
	rebuild_ncreated = 0;
	rebuild_noting = concurrently;
	PG_TRY();
	{
		ReindexStmt *stmt = makeNode(ReindexStmt);
		ParseState *pstate = make_parsestate(NULL);

		stmt->kind = REINDEX_OBJECT_INDEX;
		stmt->relation = makeRangeVar(nspname, relname, -1);
		if (concurrently)
			stmt->params = list_make1(makeDefElem("concurrently", NULL, -1));
		ExecReindex(pstate, stmt, true);
		if (ActiveSnapshotSet())
			PopActiveSnapshot();
		CommitTransactionCommand();
		done = true;
	}
	PG_CATCH();
	{
		abort_after_error(cxt);
	}
	PG_END_TRY();
	rebuild_noting = false;
	MemoryContextSwitchTo(cxt);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (done)
		ereport(LOG,
				(errmsg("amrtree: rebuilt index \"%s.%s\"", nspname, relname)));
	else
	{
		ereport(LOG,
				(errmsg("amrtree: could not rebuild index \"%s.%s\"", nspname, relname),
				 errhint("The error above says why; amrtree tries again when the index is next used, or run REINDEX INDEX %s.",
						 quote_qualified_identifier(nspname, relname))));
		if (concurrently)
		{
			int			i;

			/* the new copy, or the old index if they were swapped */
			for (i = 0; i < rebuild_ncreated; i++)
				drop_if_left_invalid(rebuild_created[i], heapoid);
			drop_if_left_invalid(indexoid, heapoid);
		}
	}
	return done;
}

/* The "amrtree rebuild" worker: one database, every index without a tree. */
void
amr_rebuild_worker_main(Datum main_arg)
{
	Oid			dbid = DatumGetObjectId(main_arg);
	MemoryContext cxt;
	List	   *todo;
	ListCell   *lc;
	bool		failed = false;
	TimestampTz now;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* the bootstrap superuser: REINDEX checks ownership */
	BackgroundWorkerInitializeConnectionByOid(dbid, InvalidOid, 0);
	cxt = AllocSetContextCreate(TopMemoryContext, "amrtree rebuild", ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(cxt);
	/* ReindexRelationConcurrently keeps its lists under PortalContext */
	PortalContext = cxt;
	/* an unusable pool is not a lost one: nothing to rebuild into */
	if (!amr_is_ready())
		proc_exit(0);

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	MemoryContextSwitchTo(cxt);
	todo = indexes_lacking_tree();
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);

	foreach(lc, todo)
	{
		CHECK_FOR_INTERRUPTS();
		if (!rebuild_one(lfirst_oid(lc)))
			failed = true;
	}

	/*
	 * A rebuild that fails (each failed REINDEX CONCURRENTLY leaves an
	 * invalid copy behind) is not retried at every query that meets the
	 * index: the next run waits, twice as long after each failure.
	 */
	now = GetCurrentTimestamp();
	SpinLockAcquire(&amr_shared->heal.mutex);
	if (failed)
	{
		int			delay_s = AMR_HEAL_RETRY_MIN_S << Min(amr_shared->heal.failures, 7);

		amr_shared->heal.failures++;
		amr_shared->heal.retry_after =
			TimestampTzPlusMilliseconds(now, (int64) Min(delay_s, AMR_HEAL_RETRY_MAX_S) * 1000);
	}
	else
		amr_shared->heal.failures = 0;
	SpinLockRelease(&amr_shared->heal.mutex);
	proc_exit(0);
}
