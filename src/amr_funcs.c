/*-------------------------------------------------------------------------
 *
 * amr_funcs.c
 *		SQL-callable functions: amrtree_check, amrtree_index_stats,
 *		amrtree_pool_stats.
 *
 * Functions that look at one index require SELECT on its table, since they
 * reveal what the index holds (counts, boxes).
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"

#include <math.h>

#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "catalog/index.h"
#include "catalog/pg_class.h"
#include "catalog/pg_inherits.h"
#include "catalog/storage.h"
#include "commands/defrem.h"
#include "funcapi.h"
#include "utils/pg_lsn.h"
#include "utils/geo_decls.h"
#include "utils/tuplestore.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/relfilenodemap.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

PG_FUNCTION_INFO_V1(amrtree_check);
PG_FUNCTION_INFO_V1(amrtree_index_stats);
PG_FUNCTION_INFO_V1(amrtree_pool_stats);
PG_FUNCTION_INFO_V1(amrtree_leaf_entries);
PG_FUNCTION_INFO_V1(amrtree_leaf_table);
PG_FUNCTION_INFO_V1(amrtree_settle);
PG_FUNCTION_INFO_V1(amrtree_tier_stats);
PG_FUNCTION_INFO_V1(amrtree_migration_stats);
PG_FUNCTION_INFO_V1(amrtree_ssd_cache_stats);

/* What an inspection function does with an index, and so what it needs. */
typedef enum AmrInspect
{
	AMR_INSPECT_SHAPE,			/* counts, sizes, placement: SELECT on the
								 * table */
	AMR_INSPECT_CONTENTS,		/* raw keys, TIDs, leaf boxes: SELECT, and no
								 * row-level security in force for the caller
								 * (EXECUTE is for superusers unless granted,
								 * see the extension script) */
	AMR_INSPECT_OWNER			/* moves leaves, or holds writers (check):
								 * ownership of the index */
} AmrInspect;

/* The access method of a relation, InvalidOid if it has none or is gone. */
static Oid
relation_am(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			am = InvalidOid;

	if (HeapTupleIsValid(tup))
	{
		am = ((Form_pg_class) GETSTRUCT(tup))->relam;
		ReleaseSysCache(tup);
	}
	return am;
}

/*
 * Open the amrtree index "indexoid" for an inspection function, after
 * checking that the caller may (see AmrInspect) -- or, for a partitioned
 * index, which has no tree of its own, the index of every leaf partition.
 * Each table is locked before its index, with lockmode, until the end of the
 * transaction.  Returns the list of open index Relations (possibly empty).
 */
static List *
open_for_inspection(Oid indexoid, AmrInspect what, LOCKMODE lockmode)
{
	char		relkind;
	Oid			heapoid;
	Oid			amoid;
	char	   *name;
	List	   *oids;
	List	   *result = NIL;
	ListCell   *lc;

	/* before any lock: a standby refuses ours with a less helpful error */
	amr_require_ready();
	relkind = get_rel_relkind(indexoid);
	name = get_rel_name(indexoid);
	if (name == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", indexoid)));
	if (relkind != RELKIND_INDEX && relkind != RELKIND_PARTITIONED_INDEX)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not an index", name)));
	amoid = get_index_am_oid("amrtree", false);
	if (relation_am(indexoid) != amoid)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not an amrtree index", name)));

	heapoid = IndexGetRelation(indexoid, false);
	if (what == AMR_INSPECT_OWNER)
	{
		if (!pg_class_ownercheck(indexoid, GetUserId()))
			aclcheck_error(ACLCHECK_NOT_OWNER, OBJECT_INDEX, name);
	}
	else
	{
		AclResult	aclresult = pg_class_aclcheck(heapoid, GetUserId(), ACL_SELECT);

		if (aclresult != ACLCHECK_OK)
			aclcheck_error(aclresult, OBJECT_TABLE, get_rel_name(heapoid));
	}

	/* the partitions' indexes are listed unlocked and locked table first */
	if (relkind == RELKIND_PARTITIONED_INDEX)
		oids = find_all_inheritors(indexoid, NoLock, NULL);
	else
		oids = list_make1_oid(indexoid);
	foreach(lc, oids)
	{
		Oid			ioid = lfirst_oid(lc);
		Oid			toid;
		Relation	heap;
		Relation	index;

		if (get_rel_relkind(ioid) != RELKIND_INDEX)
			continue;			/* a partitioned index in between */
		toid = IndexGetRelation(ioid, true);
		heap = OidIsValid(toid) ? try_relation_open(toid, lockmode) : NULL;
		index = heap != NULL ? try_relation_open(ioid, lockmode) : NULL;
		if (heap != NULL)
			relation_close(heap, NoLock);
		if (index == NULL)
		{
			/* dropped while we waited for its lock: a partition is skipped */
			if (relkind == RELKIND_PARTITIONED_INDEX)
				continue;
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("relation with OID %u does not exist", indexoid)));
		}

		/*
		 * An unlogged index has no tree on a standby: nothing of it is in the
		 * WAL, and its relation has no main fork there (only the init fork),
		 * so reading its metapage would fail with a missing file.  Refuse it
		 * as PostgreSQL refuses queries on unlogged relations during
		 * recovery; for a partitioned index, naming the partition's index.
		 */
		if (index->rd_rel->relpersistence == RELPERSISTENCE_UNLOGGED &&
			RecoveryInProgress())
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot access unlogged index \"%s\" during recovery",
							RelationGetRelationName(index)),
					 errdetail("Unlogged indexes are not replicated: a standby has no tree for them.")));

		/* the partitions' owners may differ: skip theirs, as VACUUM does */
		if (what == AMR_INSPECT_OWNER && ioid != indexoid &&
			!pg_class_ownercheck(ioid, GetUserId()))
		{
			ereport(WARNING,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied for index \"%s\", skipping it",
							RelationGetRelationName(index)),
					 errdetail("The owner of the partitioned index does not own this partition's index.")));
			relation_close(index, lockmode);
			continue;
		}
		result = lappend(result, index);
	}

	/*
	 * Raw entries would bypass row-level security, and they include rows that
	 * other sessions have not committed: like pageinspect, they are not for
	 * anyone row-level security restricts.  (Querying through a partitioned
	 * table applies its policies, not the partitions', so the table named is
	 * the one that counts.)
	 */
	if (what == AMR_INSPECT_CONTENTS &&
		check_enable_rls(heapoid, InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("cannot read the entries of amrtree index \"%s\"", name),
				 errdetail("Row-level security is enabled for table \"%s\", and raw index entries would bypass it.",
						   get_rel_name(heapoid)),
				 errhint("Query the table instead.")));
	return result;
}

static void
close_inspected(List *indexes)
{
	ListCell   *lc;

	foreach(lc, indexes)
		relation_close((Relation) lfirst(lc), NoLock);
	list_free(indexes);
}

static void corrupted(Relation index, const char *fmt,...)
			pg_attribute_printf(2, 3);

/*
 * Raise the ERROR of amrtree_check: the broken invariant, a full sentence,
 * goes into the detail.
 */
static void
corrupted(Relation index, const char *fmt,...)
{
	char		detail[1024];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	ereport(ERROR,
			(errcode(ERRCODE_INDEX_CORRUPTED),
			 errmsg("amrtree index \"%s\" is corrupted", RelationGetRelationName(index)),
			 errdetail_internal("%s", detail),
			 amr_errhint_reindex()));
}

/*
 * Allocators against the Leaf Table, for the whole pool: every slot and
 * leaf id that a word references is marked used, none is used twice, and
 * nothing else is marked (a leak).  The publish lock in exclusive mode waits
 * out every reservation that is not yet published.
 */
static void
check_allocators(Relation index)
{
	AmrStore   *s = &amr_store;
	uint8	   *slot_refs;
	uint8	   *ssd_refs;
	uint64	   *tier_counts;
	uint64		nodes_in_trees = 0;
	uint32		id;
	uint32		tn;

	slot_refs = palloc_extended((Size) s->pmem_nslots + 1, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	ssd_refs = palloc_extended((Size) s->ssd_nslots + 1, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	tier_counts = palloc0(sizeof(uint64) * AMR_MAX_TREES * 2);

	LWLockAcquire(&amr_shared->publish_lock, LW_EXCLUSIVE);
	for (id = 0; id < s->lt_capacity; id++)
	{
		uint64		word = amr_lt_word(s, id);
		bool		used = AMR_WORD_TIER(word) != AMR_TIER_NONE;

		if (used != amr_bitmap_test(s->leaf_ids_used, id))
		{
			LWLockRelease(&amr_shared->publish_lock);
			corrupted(index, "Leaf id %u is %s in the Leaf Table but %s in the leaf id bitmap.",
					  id, used ? "used" : "free", used ? "free" : "used");
		}
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			uint32		slot = AMR_WORD_SLOT(word);

			if (slot >= s->pmem_nslots || slot_refs[slot])
			{
				LWLockRelease(&amr_shared->publish_lock);
				corrupted(index, "PMEM slot %u is referenced by more than one leaf or is out of range (leaf %u).",
						  slot, id);
			}
			slot_refs[slot] = 1;
		}
		else if (AMR_WORD_TIER(word) == AMR_TIER_SSD)
		{
			uint32		slot = AMR_WORD_SLOT(word);

			if (slot >= s->ssd_nslots || ssd_refs[slot])
			{
				LWLockRelease(&amr_shared->publish_lock);
				corrupted(index, "SSD slot %u is referenced by more than one leaf or is out of range (leaf %u).",
						  slot, id);
			}
			ssd_refs[slot] = 1;
		}
		if (used)
		{
			const AmrLeafTableEntry *e = &s->lt[id];
			const AmrTreeRecord *rec = e->tree_no < AMR_MAX_TREES ?
			&s->tree_records[e->tree_no] : NULL;

			/* a dropping tree still has leaves; a free or reused one not */
			if (rec == NULL || rec->state == AMR_TREE_FREE ||
				rec->generation != e->tree_generation)
			{
				LWLockRelease(&amr_shared->publish_lock);
				corrupted(index, "Leaf %u belongs to tree %u generation %u, which no longer exists (a leaked leaf).",
						  id, e->tree_no, e->tree_generation);
			}
			tier_counts[e->tree_no * 2 + (AMR_WORD_TIER(word) == AMR_TIER_SSD ? 1 : 0)]++;
		}
	}
	for (id = 0; id < s->ssd_nslots; id++)
	{
		if ((ssd_refs[id] != 0) != amr_bitmap_test(s->ssd_used, id))
		{
			LWLockRelease(&amr_shared->publish_lock);
			corrupted(index, "SSD slot %u is %s by the Leaf Table but %s in the free-slot bitmap%s.",
					  id, ssd_refs[id] ? "referenced" : "not referenced",
					  ssd_refs[id] ? "free" : "allocated",
					  ssd_refs[id] ? "" : " (a leaked slot)");
		}
	}
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTree    *t = &s->trees[tn];

		if (s->tree_records[tn].state != AMR_TREE_VALID &&
			s->tree_records[tn].state != AMR_TREE_BUILDING)
			continue;
		if (t->pmem_leaves != tier_counts[tn * 2] || t->ssd_leaves != tier_counts[tn * 2 + 1])
		{
			LWLockRelease(&amr_shared->publish_lock);
			corrupted(index, "Tree %u counts %llu PMEM and %llu SSD leaves, the Leaf Table holds %llu and %llu.",
					  tn, (unsigned long long) t->pmem_leaves, (unsigned long long) t->ssd_leaves,
					  (unsigned long long) tier_counts[tn * 2],
					  (unsigned long long) tier_counts[tn * 2 + 1]);
		}
	}
	for (id = 0; id < s->pmem_nslots; id++)
	{
		if ((slot_refs[id] != 0) != amr_bitmap_test(s->pmem_used, id))
		{
			LWLockRelease(&amr_shared->publish_lock);
			corrupted(index, "PMEM slot %u is %s by the Leaf Table but %s in the free-slot bitmap%s.",
					  id, slot_refs[id] ? "referenced" : "not referenced",
					  slot_refs[id] ? "free" : "allocated",
					  slot_refs[id] ? "" : " (a leaked slot)");
		}
	}
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
		nodes_in_trees += amr_counter_read(&s->trees[tn].ninner);
	if (nodes_in_trees != amr_bitmap_count(s->nodes_used))
	{
		uint64		used = amr_bitmap_count(s->nodes_used);

		LWLockRelease(&amr_shared->publish_lock);
		corrupted(index, "%llu inner nodes are allocated but the trees hold %llu.",
				  (unsigned long long) used, (unsigned long long) nodes_in_trees);
	}
	LWLockRelease(&amr_shared->publish_lock);
	pfree(slot_refs);
	pfree(ssd_refs);
	pfree(tier_counts);
}

/*
 * Trees of this database whose index no longer exists: they hold leaves
 * that only the next restart would reclaim.  A tree that a transaction in
 * progress (or just committed, and now freeing it) drops is not one.
 * Other databases' trees cannot be looked up from here.
 */
static void
check_orphan_trees(Relation index)
{
	AmrStore   *s = &amr_store;
	uint32		tn;
	RelFileNode *dropping;
	int			ndropping;

	/*
	 * The relation files this transaction drops at commit (DROP INDEX,
	 * TRUNCATE, REINDEX, ...): our catalog snapshot no longer names them,
	 * while their trees are counted as dropping only when the commit begins.
	 */
	ndropping = smgrGetPendingDeletes(true, &dropping);
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &s->tree_records[tn];
		Oid			spc;
		uint32		generation = rec->generation;
		int			attempt;
		int			i;
		bool		found = false;

		/* temporary trees are other backends' business, gone at restart */
		if (rec->state != AMR_TREE_VALID || rec->db_oid != MyDatabaseId ||
			(rec->flags & AMR_TREE_FLAG_TEMP) ||
			amr_sync_read(&s->trees[tn].drops_pending) > 0)
			continue;
		for (i = 0; i < ndropping && !found; i++)
			found = dropping[i].relNode == rec->relfilenode &&
				dropping[i].spcNode == rec->spc_oid && dropping[i].dbNode == rec->db_oid;
		/* pg_class says 0 for the database's default tablespace */
		spc = rec->spc_oid == MyDatabaseTableSpace ? InvalidOid : rec->spc_oid;
		for (attempt = 0; attempt < 2 && !found; attempt++)
		{
			if (attempt > 0)
			{
				/* an index committed after our catalog snapshot was taken */
				AcceptInvalidationMessages();
				InvalidateCatalogSnapshot();
			}
			found = OidIsValid(RelidByRelfilenode(spc, rec->relfilenode));
		}
		if (!found && rec->state == AMR_TREE_VALID && rec->generation == generation &&
			amr_sync_read(&s->trees[tn].drops_pending) == 0)
			corrupted(index, "Tree %u (relfilenode %u of this database) belongs to no index (a leaked tree).",
					  tn, rec->relfilenode);
	}
	if (ndropping > 0)
		pfree(dropping);
}

/* The WAL position a Leaf Table lsn_hint stands for (0: unknown). */
static XLogRecPtr
hint_position(uint32 lsn_hint)
{
	return lsn_hint == AMR_LSN_HINT_UNKNOWN ? InvalidXLogRecPtr :
		(XLogRecPtr) lsn_hint << AMR_LSN_HINT_SHIFT;
}

/*
 * Leaf images of one tree against the Leaf Table: every image is read from
 * its tier (SSD images have their checksum verified), and a DRAM copy held
 * by rule R6 must equal the persistent image.  Caller holds the tree
 * exclusively, so no leaf splits or appears meanwhile.
 */
static void
check_leaves(Relation index, AmrTree *t)
{
	AmrStore   *s = &amr_store;
	AmrLeaf    *leaf = amr_alloc_leaf_buffer();
	uint64		entries = 0;
	uint32		id;
	uint64		word;

	for (id = 0; amr_lt_next_of_tree(s, t->tree_no, t->generation, &id, &word); id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];
		AmrFBox		mbr;
		bool		nulls;
		uint64		i;
		uint64		live;

		CHECK_FOR_INTERRUPTS();

reread:
		/* the persistent image, not a DRAM copy */
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			LWLockAcquire(amr_leaf_lock(id), LW_SHARED);
			word = amr_lt_word(s, id);
			if (AMR_WORD_TIER(word) == AMR_TIER_PMEM && AMR_WORD_SLOT(word) < s->pmem_nslots)
			{
				const AmrLeaf *p = amr_pmem_slot(s, AMR_WORD_SLOT(word));

				memcpy(leaf, p, Min(amr_leaf_image_bytes(p), (Size) AMR_SLOT_SIZE));
			}
			LWLockRelease(amr_leaf_lock(id));
			if (AMR_WORD_SLOT(word) >= s->pmem_nslots)
				corrupted(index, "Leaf %u has Leaf Table word %016llx, which names no PMEM slot.",
						  id, (unsigned long long) word);
		}
		else
		{
			uint32		slot = AMR_WORD_SLOT(word);

			if (AMR_WORD_TIER(word) != AMR_TIER_SSD || slot >= s->ssd_nslots)
				corrupted(index, "Leaf %u has Leaf Table word %016llx, which names no slot.",
						  id, (unsigned long long) word);
			amr_ssd_read_images(index, &slot, &leaf, 1);
			if (amr_lt_word(s, id) != word)
			{
				/* migrated while we read: read the new image */
				word = amr_lt_word(s, id);
				goto reread;
			}
			if (!amr_leaf_image_checksum_ok(leaf))
				corrupted(index, "The image of leaf %u in SSD slot %u fails its checksum.", id, slot);
		}
		nulls = (e->flags & AMR_LT_FLAG_NULLS) != 0;
		mbr = amr_lt_mbr(s, id, word);
		if (leaf->hdr.magic != AMR_LEAF_MAGIC || leaf->hdr.leaf_id != id ||
			leaf->hdr.tree_no != t->tree_no ||
			leaf->hdr.tree_generation != t->generation ||
			leaf->hdr.version != AMR_WORD_VERSION(word) ||
			leaf->hdr.nentries > AMR_LEAF_CAPACITY ||
			((leaf->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0) != nulls)
			corrupted(index, "The header of leaf %u (%s slot %u: magic 0x%08x, leaf %u, tree %u, version %u, %llu entries) does not match its Leaf Table entry (tree %u, version %u).",
					  id, AMR_WORD_TIER(word) == AMR_TIER_SSD ? "SSD" : "PMEM",
					  AMR_WORD_SLOT(word), leaf->hdr.magic, leaf->hdr.leaf_id,
					  leaf->hdr.tree_no, leaf->hdr.version,
					  (unsigned long long) leaf->hdr.nentries, t->tree_no,
					  AMR_WORD_VERSION(word));
		for (i = 0; i < leaf->hdr.nentries; i++)
		{
			const AmrLeafEntry *en = &leaf->entries[i];
			bool		isnull = (en->flags & AMR_ENTRY_FLAG_NULL) != 0;

			if (en->flags & AMR_ENTRY_FLAG_DEAD)
				continue;
			if (isnull != nulls)
				corrupted(index, "Entry %llu of leaf %u is %s but the leaf holds %s keys.",
						  (unsigned long long) i, id, isnull ? "NULL" : "a box",
						  nulls ? "NULL" : "box");
			if (!isnull)
			{
				AmrFBox		b = amr_fbox_from_box(&en->key);

				if (amr_box_has_nan(&en->key) != ((en->flags & AMR_ENTRY_FLAG_NAN) != 0))
					corrupted(index, "Entry %llu of leaf %u has a NaN flag that does not match its key.",
							  (unsigned long long) i, id);
				if (!amr_fbox_covers(&mbr, &b))
					corrupted(index, "Entry %llu of leaf %u is not covered by the leaf's Leaf Table box.",
							  (unsigned long long) i, id);
			}
		}
		live = amr_leaf_live_entries(leaf);
		if (AMR_WORD_TIER(word) == AMR_TIER_SSD && live != e->entries)
			/* the WAL hints too: they tell which change wrote the count */
			corrupted(index, "SSD leaf %u holds %llu entries, its Leaf Table entry says %u (version %u in slot %u; WAL hint of the image %X/%X, of the Leaf Table %X/%X).",
					  id, (unsigned long long) live, e->entries,
					  AMR_WORD_VERSION(word), AMR_WORD_SLOT(word),
					  LSN_FORMAT_ARGS(hint_position(amr_leaf_lsn_hint(leaf, 0))),
					  LSN_FORMAT_ARGS(hint_position(e->lsn_hint)));
		entries += live;

		/* a DRAM copy (rule R6) must be the persistent image */
		LWLockAcquire(amr_leaf_lock(id), LW_SHARED);
		if (s->leaves[id].dram_copy >= 0 && amr_lt_word(s, id) == word)
		{
			const AmrLeaf *c = &amr_leaf_cache[s->leaves[id].dram_copy];

			if (c->hdr.nentries != leaf->hdr.nentries ||
				memcmp(c->entries, leaf->entries, leaf->hdr.nentries * sizeof(AmrLeafEntry)) != 0)
			{
				LWLockRelease(amr_leaf_lock(id));
				corrupted(index, "The DRAM copy of leaf %u differs from its persistent image.", id);
			}
		}
		LWLockRelease(amr_leaf_lock(id));
	}
	if (entries != amr_counter_read(&t->nentries))
		corrupted(index, "The leaves hold %llu entries but the tree counts %llu.",
				  (unsigned long long) entries,
				  (unsigned long long) amr_counter_read(&t->nentries));
}

/*
 * amrtree_check(index): raise an ERROR naming the first broken invariant,
 * return true otherwise.  Takes AccessShareLock, like amcheck's
 * bt_index_check: while it looks at a tree it holds the tree lock
 * exclusively (inserts, and VACUUM's leaf rewrites, which take it in shared
 * mode, wait for that moment) and the tree's tier lock (no migration), but
 * it never holds a relation lock that VACUUM or DDL would wait for beyond
 * what a query holds.
 */
Datum
amrtree_check(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	List	   *indexes = open_for_inspection(indexoid, AMR_INSPECT_OWNER, AccessShareLock);
	ListCell   *lc;
	uint8	   *seen;

	/*
	 * The pool-wide checks hold every insert of every amrtree index in the
	 * cluster while they walk the Leaf Table, and their errors name other
	 * databases' trees: for superusers only.  The owner of an index checks
	 * its tree, which holds the inserts into that index alone.
	 */
	bool		pool_checked = !superuser();

	seen = palloc_extended((Size) amr_store.lt_capacity + 1, MCXT_ALLOC_HUGE);
	foreach(lc, indexes)
	{
		Relation	index = (Relation) lfirst(lc);
		AmrTree    *t = amr_tree_open(index);
		char		buf[1024];
		const char *problem;

		/* no migrations of this tree while we look at it */
		amr_tier_lock(t);
		if (!pool_checked)
		{
			check_allocators(index);
			check_orphan_trees(index);
			pool_checked = true;
		}

		/*
		 * A standby's replay may have left the nodes to be packed since the
		 * open: packed here, under the publish lock as in
		 * amr_tree_pack_if_stale, so that another check's count of the pool's
		 * nodes does not see the repack half done.
		 */
		LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
		LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
		if (t->inner_stale)
			amr_tree_rebuild_inner(t);
		problem = amr_check_tree(&amr_store, t, seen, buf, sizeof(buf));
		if (problem != NULL)
		{
			LWLockRelease(amr_tree_lock(t));
			LWLockRelease(&amr_shared->publish_lock);
			corrupted(index, "%s.", problem);
		}
		check_leaves(index, t);
		LWLockRelease(amr_tree_lock(t));
		LWLockRelease(&amr_shared->publish_lock);
		amr_tier_unlock();
	}
	pfree(seen);
	close_inspected(indexes);
	PG_RETURN_BOOL(true);
}

/* Leaves of a tree per tier, counted in the Leaf Table. */
static void
count_leaves(const AmrTree *t, uint64 *pmem_leaves, uint64 *ssd_leaves)
{
	uint32		id;
	uint64		word;

	for (id = 0; amr_lt_next_of_tree(&amr_store, t->tree_no, t->generation, &id, &word); id++)
	{
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
			(*pmem_leaves)++;
		else if (AMR_WORD_TIER(word) == AMR_TIER_SSD)
			(*ssd_leaves)++;
	}
}

/*
 * amrtree_index_stats(index): shape and size per tier; for a partitioned
 * index, the sums over its partitions (height: the tallest).
 */
Datum
amrtree_index_stats(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	List	   *indexes;
	ListCell   *lc;
	TupleDesc	tupdesc;
	Datum		values[8];
	bool		nulls[8] = {0};
	const char *status = NULL;
	int32		height = 0;
	uint64		inner = 0;
	uint64		entries = 0;
	uint64		pmem_leaves = 0;
	uint64		ssd_leaves = 0;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	indexes = open_for_inspection(indexoid, AMR_INSPECT_SHAPE, AccessShareLock);
	foreach(lc, indexes)
	{
		AmrTreeUse	use;
		AmrTree    *t = amr_tree_lookup((Relation) lfirst(lc), &use);

		if (t == NULL)
		{
			/* the worst state among the partitions */
			if (use == AMR_USE_DAMAGED || status == NULL)
				status = use == AMR_USE_DAMAGED ? "damaged" :
					RecoveryInProgress() ? "no tree" :
					!((Relation) lfirst(lc))->rd_index->indisvalid ? "invalid (DROP or REINDEX)" :
					amr_auto_rebuild ? "rebuilding" : "no tree (REINDEX)";
			continue;
		}
		count_leaves(t, &pmem_leaves, &ssd_leaves);
		LWLockAcquire(amr_tree_lock(t), LW_SHARED);
		height = Max(height, (int32) t->height);
		inner += amr_counter_read(&t->ninner);
		LWLockRelease(amr_tree_lock(t));
		entries += amr_counter_read(&t->nentries);
	}
	close_inspected(indexes);

	values[0] = Int32GetDatum(height);
	values[1] = Int64GetDatum((int64) inner);
	values[2] = Int64GetDatum((int64) (pmem_leaves + ssd_leaves));
	values[3] = Int64GetDatum((int64) entries);
	values[4] = Int64GetDatum((int64) (inner * sizeof(AmrInnerNode)));
	values[5] = Int64GetDatum((int64) (pmem_leaves * AMR_SLOT_SIZE));
	values[6] = Int64GetDatum((int64) (ssd_leaves * AMR_SLOT_SIZE));
	/* the 0.2 definition has no status column */
	if (tupdesc->natts > 7)
		values[7] = CStringGetTextDatum(status ? status : "ok");
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * amrtree_pool_stats(): cluster-wide usage.  EXECUTE is granted to
 * pg_monitor by the extension script, so administrators may delegate it.
 */
Datum
amrtree_pool_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[11];
	bool		nulls[11] = {0};
	StringInfoData desc;
	uint32		tn;
	int32		trees = 0;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	amr_require_ready();

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
		if (amr_store.tree_records[tn].state == AMR_TREE_VALID ||
			amr_store.tree_records[tn].state == AMR_TREE_BUILDING)
			trees++;

	initStringInfo(&desc);
	amr_pool_describe(&desc);
	values[0] = CStringGetTextDatum(desc.data);
	values[1] = Int64GetDatum((int64) amr_store.pmem_nslots);
	values[2] = Int64GetDatum((int64) amr_bitmap_count(amr_store.pmem_used));
	values[3] = Int64GetDatum((int64) amr_store.ssd_nslots);
	values[4] = Int64GetDatum(amr_store.ssd_used ?
							  (int64) amr_bitmap_count(amr_store.ssd_used) : 0);
	values[5] = Int64GetDatum((int64) amr_store.lt_capacity);
	values[6] = Int64GetDatum((int64) amr_bitmap_count(amr_store.leaf_ids_used));
	values[7] = Int64GetDatum((int64) amr_store.nnodes);
	values[8] = Int64GetDatum((int64) amr_bitmap_count(amr_store.nodes_used));
	values[9] = Int32GetDatum(trees);
	values[10] = Int64GetDatum((int64) pg_atomic_read_u64(&amr_shared->rebuilds));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * amrtree_ssd_cache_stats(): the SSD cache is shared by every index of the
 * cluster, so these are cluster-wide counters, like pg_stat_bgwriter's.
 * EXECUTE is granted to pg_monitor by the extension script.
 */
Datum
amrtree_ssd_cache_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {0};
	uint64		counters[4];
	int			i;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	amr_require_ready();
	amr_ssd_cache_counters(&counters[0], &counters[1], &counters[2], &counters[3]);
	for (i = 0; i < 4; i++)
		values[i] = Int64GetDatum((int64) counters[i]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * amrtree_leaf_entries(index): every entry of every leaf, like
 * pageinspect's page items: (leaf_id, entry, tid, box, insert_lsn, dead).
 * For diagnosis; it reads the whole index.  Raw contents: see AmrInspect.
 */
Datum
amrtree_leaf_entries(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *indexes;
	ListCell   *lc;
	AmrLeaf    *buf;

	InitMaterializedSRF(fcinfo, 0);
	indexes = open_for_inspection(indexoid, AMR_INSPECT_CONTENTS, AccessShareLock);
	buf = amr_alloc_leaf_buffer();
	foreach(lc, indexes)
	{
		Relation	index = (Relation) lfirst(lc);
		AmrTree    *t = amr_tree_open(index);
		uint32		id;
		uint64		word;

		for (id = 0; amr_lt_next_of_tree(&amr_store, t->tree_no, t->generation, &id, &word); id++)
		{
			uint64		i;

			CHECK_FOR_INTERRUPTS();
			if (amr_leaf_read(index, t, id, buf, NULL, NULL) == 0)
				continue;
			for (i = 0; i < buf->hdr.nentries; i++)
			{
				const AmrLeafEntry *en = &buf->entries[i];
				Datum		values[6];
				bool		nulls[6] = {0};
				ItemPointer tid = palloc(sizeof(ItemPointerData));

				memcpy(tid, &en->tid_blk_hi, sizeof(ItemPointerData));
				values[0] = Int64GetDatum((int64) id);
				values[1] = Int32GetDatum((int32) i);
				values[2] = PointerGetDatum(tid);
				if (en->flags & AMR_ENTRY_FLAG_NULL)
					nulls[3] = true;
				else
					values[3] = BoxPGetDatum(amr_box_to_pg(&en->key));
				values[4] = LSNGetDatum((XLogRecPtr) en->insert_lsn);
				values[5] = BoolGetDatum((en->flags & AMR_ENTRY_FLAG_DEAD) != 0);
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			}
		}
	}
	close_inspected(indexes);
	return (Datum) 0;
}

/*
 * amrtree_leaf_table(index): one row per leaf of the index (tier, version,
 * live entries, hotness, box).  Raw contents: see AmrInspect.
 */
Datum
amrtree_leaf_table(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	AmrStore   *s = &amr_store;
	double		now = amr_now_seconds();
	List	   *indexes;
	ListCell   *lc;

	InitMaterializedSRF(fcinfo, 0);
	indexes = open_for_inspection(indexoid, AMR_INSPECT_CONTENTS, AccessShareLock);
	foreach(lc, indexes)
	{
		AmrTree    *t = amr_tree_open((Relation) lfirst(lc));
		uint32		id;
		uint64		word;

		for (id = 0; amr_lt_next_of_tree(s, t->tree_no, t->generation, &id, &word); id++)
		{
			const AmrLeafTableEntry *e = &s->lt[id];
			Datum		values[6];
			bool		nulls[6] = {0};
			AmrFBox		m;
			int32		entries;

			CHECK_FOR_INTERRUPTS();
			if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
			{
				LWLockAcquire(amr_leaf_lock(id), LW_SHARED);
				word = amr_lt_word(s, id);
				entries = AMR_WORD_TIER(word) == AMR_TIER_PMEM
					? (int32) amr_leaf_live_entries(amr_pmem_slot(s, AMR_WORD_SLOT(word)))
					: (int32) e->entries;
				LWLockRelease(amr_leaf_lock(id));
			}
			else
				entries = (int32) e->entries;
			m = amr_lt_mbr(s, id, word);
			values[0] = Int64GetDatum((int64) id);
			values[1] = CStringGetTextDatum(AMR_WORD_TIER(word) == AMR_TIER_SSD ? "ssd" : "pmem");
			values[2] = Int64GetDatum((int64) AMR_WORD_VERSION(word));
			values[3] = Int32GetDatum(entries);
			values[4] = Float8GetDatum(amr_hotness_now(&s->leaves[id], now, amr_decay_lambda));
			if (amr_fbox_is_empty(&m) || (e->flags & AMR_LT_FLAG_NULLS))
				nulls[5] = true;
			else
			{
				AmrBox		b = {m.xlo, m.ylo, m.xhi, m.yhi};

				values[5] = BoxPGetDatum(amr_box_to_pg(&b));
			}
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	close_inspected(indexes);
	return (Datum) 0;
}

static void
wait_seconds(double seconds)
{
	TimestampTz end = GetCurrentTimestamp() + (TimestampTz) (seconds * USECS_PER_SEC);

	for (;;)
	{
		long		ms = (long) ((end - GetCurrentTimestamp()) / 1000);

		if (ms <= 0)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(ms, 1000L), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

static uint64
settle_cycle(AmrTree *t)
{
	uint64		moved;

	amr_tier_lock(t);
	PG_TRY();
	{
		moved = amr_tier_cycle_tree(t);
	}
	PG_FINALLY();
	{
		amr_tier_unlock();
	}
	PG_END_TRY();
	return moved;
}

/*
 * The indexes of an inspection list whose leaves settle can move; warns
 * about, closes and leaves out the others.  The tier manager moves only the
 * leaves of trees whose creating transaction committed (a migration is
 * logged against a tree that replay and recovery know), so the tree of an
 * index built or rebuilt (REINDEX, TRUNCATE, CLUSTER, SET UNLOGGED) earlier
 * in this transaction stays where its build put it until the commit.
 */
static List *
settled_trees(List *indexes)
{
	List	   *kept = NIL;
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = (Relation) lfirst(lc);
		AmrTree    *t = amr_tree_open(index);

		if (amr_store.tree_records[t->tree_no].state == AMR_TREE_BUILDING)
		{
			ereport(WARNING,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("amrtree_settle skipped index \"%s\"",
							RelationGetRelationName(index)),
					 errdetail("The index was built by a transaction that has not committed yet."),
					 errhint("Run amrtree_settle after that transaction commits.")));
			relation_close(index, NoLock);
			continue;
		}
		kept = lappend(kept, index);
	}
	list_free(indexes);
	return kept;
}

/*
 * amrtree_settle(index, settle_seconds): paper 3.2 c -- scan, budget check
 * and queue processing now, sleep, and again, repeated until a cycle has
 * nothing left to move.  Returns the moves made.  It moves leaves, so it is
 * for the index's owner.
 */
Datum
amrtree_settle(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	double		seconds = PG_GETARG_FLOAT8(1);
	List	   *indexes;
	ListCell   *lc;
	uint64		moved = 0;

	/* a standby's leaves move only by WAL replay */
	PreventCommandDuringRecovery("amrtree_settle()");
	if (isnan(seconds) || seconds < 0 || seconds > 3600)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("settle_seconds must be between 0 and 3600")));
	indexes = open_for_inspection(indexoid, AMR_INSPECT_OWNER, AccessShareLock);
	indexes = settled_trees(indexes);
	foreach(lc, indexes)
		moved += settle_cycle(amr_tree_open((Relation) lfirst(lc)));
	wait_seconds(seconds);
	foreach(lc, indexes)
	{
		AmrTree    *t = amr_tree_open((Relation) lfirst(lc));
		uint64		last;
		int			rounds = 0;

		do
		{
			last = settle_cycle(t);
			moved += last;
		} while (last > 0 && ++rounds < 100);
	}
	close_inspected(indexes);
	PG_RETURN_INT64((int64) moved);
}

/*
 * amrtree_tier_stats(index): leaves and bytes per tier with the PMEM
 * budget; for a partitioned index the sums (the budget is NULL if any
 * partition has none).
 */
Datum
amrtree_tier_stats(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *indexes;
	ListCell   *lc;
	int64		leaves[3] = {0};
	int64		bytes[3] = {0};
	int64		budget_bytes = 0;
	bool		budget_null = false;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	indexes = open_for_inspection(indexoid, AMR_INSPECT_SHAPE, AccessShareLock);
	if (indexes == NIL)
		budget_null = true;
	foreach(lc, indexes)
	{
		AmrTree    *t = amr_tree_open((Relation) lfirst(lc));
		int64		dram = (int64) amr_counter_read(&t->dram_leaves);
		int64		pmem = (int64) amr_counter_read(&t->pmem_leaves);
		int64		ssd = (int64) amr_counter_read(&t->ssd_leaves);

		/* DRAM: the inner nodes, and leaves held there by rule R6 */
		leaves[0] += dram;
		bytes[0] += (int64) amr_counter_read(&t->ninner) * sizeof(AmrInnerNode) +
			dram * AMR_SLOT_SIZE;
		leaves[1] += pmem;
		bytes[1] += pmem * AMR_SLOT_SIZE;
		leaves[2] += ssd;
		bytes[2] += ssd * AMR_SLOT_SIZE;
		/* without an SSD tier no budget applies (amr_tree_budget_leaves) */
		if (t->budget_kind == AMR_BUDGET_UNLIMITED || !t->tiering ||
			amr_store.ssd_used == NULL)
			budget_null = true;
		else
			budget_bytes += t->budget_kind == AMR_BUDGET_BYTES ? (int64) t->budget_value
				: (int64) amr_tree_budget_leaves(t, 0) * AMR_SLOT_SIZE;
	}
	close_inspected(indexes);

	for (i = 0; i < 3; i++)
	{
		static const char *const names[] = {"dram", "pmem", "ssd"};
		Datum		values[4];
		bool		nulls[4] = {0};

		values[0] = CStringGetTextDatum(names[i]);
		values[1] = Int64GetDatum(leaves[i]);
		values[2] = Int64GetDatum(bytes[i]);
		if (i != 1 || budget_null)
			nulls[3] = true;
		else
			values[3] = Int64GetDatum(budget_bytes);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * amrtree_migration_stats(index): what the tier manager did since the
 * server started; for a partitioned index the sums (last_scan, the latest pass: the maximum).
 */
Datum
amrtree_migration_stats(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	List	   *indexes;
	ListCell   *lc;
	TupleDesc	tupdesc;
	Datum		values[7];
	bool		nulls[7] = {0};
	uint64		sums[6] = {0};
	double		last_pass = 0;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	indexes = open_for_inspection(indexoid, AMR_INSPECT_SHAPE, AccessShareLock);
	foreach(lc, indexes)
	{
		AmrTree    *t = amr_tree_open((Relation) lfirst(lc));

		/* SSD leaves rewritten to PMEM by writes count as promotions too */
		sums[0] += amr_counter_read(&t->promotions) +
			amr_counter_read(&t->write_promotions);
		sums[1] += amr_counter_read(&t->demotions);
		sums[2] += amr_counter_read(&t->bytes_moved);
		sums[3] += amr_counter_read(&t->budget_demotions);
		sums[4] += amr_counter_read(&t->rule_demotions);
		sums[5] += amr_counter_read(&t->tier_passes);
		last_pass = Max(last_pass, t->last_tier_pass);
	}
	close_inspected(indexes);

	for (i = 0; i < 6; i++)
		values[i] = Int64GetDatum((int64) sums[i]);
	if (last_pass <= 0)
		nulls[6] = true;
	else
		values[6] = TimestampTzGetDatum((TimestampTz)
										((last_pass - (double) ((POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY))
										 * USECS_PER_SEC));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
