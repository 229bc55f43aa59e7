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
#include "amrtree.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/index.h"
#include "catalog/pg_authid.h"
#include "commands/defrem.h"
#include "funcapi.h"
#include "utils/pg_lsn.h"
#include "utils/geo_decls.h"
#include "utils/tuplestore.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/relfilenodemap.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(amrtree_check);
PG_FUNCTION_INFO_V1(amrtree_index_stats);
PG_FUNCTION_INFO_V1(amrtree_pool_stats);
PG_FUNCTION_INFO_V1(amrtree_leaf_entries);

/*
 * Open an amrtree index for inspection, after checking that the caller may
 * read its table.  The table is locked in "lockmode" and stays locked until
 * the end of the transaction.
 */
Relation
amr_open_index_for_inspection(Oid indexoid, LOCKMODE lockmode)
{
	Oid			heapoid = IndexGetRelation(indexoid, true);
	AclResult	aclresult;
	Relation	heap;
	Relation	index;

	/* before any lock: a standby refuses ours with a less helpful error */
	amr_require_ready();
	if (!OidIsValid(heapoid))
	{
		char	   *name = get_rel_name(indexoid);

		if (name == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("relation with OID %u does not exist", indexoid)));
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not an index", name)));
	}
	aclresult = pg_class_aclcheck(heapoid, GetUserId(), ACL_SELECT);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_TABLE, get_rel_name(heapoid));

	heap = table_open(heapoid, lockmode);
	index = index_open(indexoid, lockmode);
	table_close(heap, NoLock);
	if (index->rd_rel->relam != get_index_am_oid("amrtree", false))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not an amrtree index",
						RelationGetRelationName(index))));
	return index;
}

static void
corrupted(Relation index, const char *fmt,...) pg_attribute_printf(2, 3);

static void
corrupted(Relation index, const char *fmt,...)
{
	char		msg[1024];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ereport(ERROR,
			(errcode(ERRCODE_INDEX_CORRUPTED),
			 errmsg("amrtree index \"%s\" is broken: %s",
					RelationGetRelationName(index), msg)));
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
			corrupted(index, "leaf id %u is %s in the Leaf Table but %s in the leaf id bitmap",
					  id, used ? "used" : "free", used ? "free" : "used");
		}
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			uint32		slot = AMR_WORD_SLOT(word);

			if (slot >= s->pmem_nslots || slot_refs[slot])
			{
				LWLockRelease(&amr_shared->publish_lock);
				corrupted(index, "PMEM slot %u is referenced by more than one leaf or is out of range (leaf %u)",
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
				corrupted(index, "SSD slot %u is referenced by more than one leaf or is out of range (leaf %u)",
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
				corrupted(index, "leaf %u belongs to tree %u generation %u, which no longer exists (a leaked leaf)",
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
			corrupted(index, "SSD slot %u is %s by the Leaf Table but %s in the free-slot bitmap%s",
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
			corrupted(index, "tree %u counts %llu PMEM and %llu SSD leaves, the Leaf Table holds %llu and %llu",
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
			corrupted(index, "PMEM slot %u is %s by the Leaf Table but %s in the free-slot bitmap%s",
					  id, slot_refs[id] ? "referenced" : "not referenced",
					  slot_refs[id] ? "free" : "allocated",
					  slot_refs[id] ? "" : " (a leaked slot)");
		}
	}
	for (tn = 0; tn < AMR_MAX_TREES; tn++)
		nodes_in_trees += __atomic_load_n(&s->trees[tn].ninner, __ATOMIC_RELAXED);
	if (nodes_in_trees != amr_bitmap_count(s->nodes_used))
	{
		uint64		used = amr_bitmap_count(s->nodes_used);

		LWLockRelease(&amr_shared->publish_lock);
		corrupted(index, "%llu inner nodes are allocated but the trees hold %llu",
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

	for (tn = 0; tn < AMR_MAX_TREES; tn++)
	{
		AmrTreeRecord *rec = &s->tree_records[tn];
		Oid			spc;
		uint32		generation = rec->generation;
		int			attempt;
		bool		found = false;

		if (rec->state != AMR_TREE_VALID || rec->db_oid != MyDatabaseId ||
			__atomic_load_n(&s->trees[tn].drops_pending, __ATOMIC_SEQ_CST) > 0)
			continue;
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
			__atomic_load_n(&s->trees[tn].drops_pending, __ATOMIC_SEQ_CST) == 0)
			corrupted(index, "tree %u (relfilenode %u of this database) belongs to no index (a leaked tree)",
					  tn, rec->relfilenode);
	}
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

	for (id = 0; id < s->lt_capacity; id++)
	{
		AmrLeafTableEntry *e = &s->lt[id];
		uint64		word = amr_lt_word(s, id);
		AmrFBox		mbr;
		bool		nulls;
		uint64		i;
		uint64		live;

		if ((id & 0xFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (!amr_lt_owned_by(s, id, word, t->tree_no, t->generation))
			continue;

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
				corrupted(index, "leaf %u has Leaf Table word %016llx, which names no PMEM slot",
						  id, (unsigned long long) word);
		}
		else
		{
			uint32		slot = AMR_WORD_SLOT(word);

			if (AMR_WORD_TIER(word) != AMR_TIER_SSD || slot >= s->ssd_nslots)
				corrupted(index, "leaf %u has Leaf Table word %016llx, which names no slot",
						  id, (unsigned long long) word);
			amr_ssd_read_images(index, &slot, &leaf, 1);
			if (amr_lt_word(s, id) != word)
			{
				/* migrated while we read: read the new image */
				word = amr_lt_word(s, id);
				goto reread;
			}
			if (!amr_leaf_image_checksum_ok(leaf))
				corrupted(index, "the image of leaf %u in SSD slot %u fails its checksum", id, slot);
		}
		nulls = (e->flags & AMR_LT_FLAG_NULLS) != 0;
		mbr = amr_lt_mbr(s, id, word);
		if (leaf->hdr.magic != AMR_LEAF_MAGIC || leaf->hdr.leaf_id != id ||
			leaf->hdr.tree_no != t->tree_no ||
			leaf->hdr.tree_generation != t->generation ||
			leaf->hdr.version != AMR_WORD_VERSION(word) ||
			leaf->hdr.nentries > AMR_LEAF_CAPACITY ||
			((leaf->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0) != nulls)
			corrupted(index, "the header of leaf %u (%s slot %u: magic 0x%08x, leaf %u, tree %u, version %u, %llu entries) does not match its Leaf Table entry (tree %u, version %u)",
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
				corrupted(index, "entry %llu of leaf %u is %s but the leaf holds %s keys",
						  (unsigned long long) i, id, isnull ? "NULL" : "a box",
						  nulls ? "NULL" : "box");
			if (!isnull)
			{
				AmrFBox		b = amr_fbox_from_box(&en->key);

				if (amr_box_has_nan(&en->key) || !amr_fbox_covers(&mbr, &b))
					corrupted(index, "entry %llu of leaf %u is not covered by the leaf's Leaf Table box",
							  (unsigned long long) i, id);
			}
		}
		live = amr_leaf_live_entries(leaf);
		if (AMR_WORD_TIER(word) == AMR_TIER_SSD && live != e->entries)
			corrupted(index, "SSD leaf %u holds %llu entries, its Leaf Table entry says %u",
					  id, (unsigned long long) live, e->entries);
		entries += live;

		/* a DRAM copy (rule R6) must be the persistent image */
		LWLockAcquire(amr_leaf_lock(id), LW_SHARED);
		if (s->leaves[id].cache_slot >= 0 && amr_lt_word(s, id) == word)
		{
			const AmrLeaf *c = &amr_leaf_cache[s->leaves[id].cache_slot];

			if (c->hdr.nentries != leaf->hdr.nentries ||
				memcmp(c->entries, leaf->entries, leaf->hdr.nentries * sizeof(AmrLeafEntry)) != 0)
			{
				LWLockRelease(amr_leaf_lock(id));
				corrupted(index, "the DRAM copy of leaf %u differs from its persistent image", id);
			}
		}
		LWLockRelease(amr_leaf_lock(id));
	}
	if (entries != __atomic_load_n(&t->nentries, __ATOMIC_RELAXED))
		corrupted(index, "the leaves hold %llu entries but the tree counts %llu",
				  (unsigned long long) entries,
				  (unsigned long long) __atomic_load_n(&t->nentries, __ATOMIC_RELAXED));
}

Datum
amrtree_check(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	Relation	index;
	AmrTree    *t;
	uint8	   *seen;
	char		buf[1024];
	const char *problem;

	/* ShareUpdateExclusiveLock keeps VACUUM out; inserts wait on the tree */
	index = amr_open_index_for_inspection(indexoid, ShareUpdateExclusiveLock);
	t = amr_tree_open(index);

	/* no migrations of this tree while we look at it */
	amr_tier_lock(t);
	check_allocators(index);
	check_orphan_trees(index);

	seen = palloc_extended((Size) amr_store.lt_capacity + 1, MCXT_ALLOC_HUGE);
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	problem = amr_check_tree(&amr_store, t, seen, buf, sizeof(buf));
	if (problem != NULL)
	{
		LWLockRelease(amr_tree_lock(t));
		corrupted(index, "%s", problem);
	}
	check_leaves(index, t);
	LWLockRelease(amr_tree_lock(t));
	amr_tier_unlock();

	pfree(seen);
	index_close(index, NoLock);
	PG_RETURN_BOOL(true);
}

Datum
amrtree_index_stats(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	Relation	index;
	AmrTree    *t;
	TupleDesc	tupdesc;
	Datum		values[7];
	bool		nulls[7] = {0};
	uint64		pmem_leaves = 0;
	uint64		ssd_leaves = 0;
	uint32		id;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	index = amr_open_index_for_inspection(indexoid, AccessShareLock);
	t = amr_tree_open(index);

	for (id = 0; id < amr_store.lt_capacity; id++)
	{
		uint64		word = amr_lt_word(&amr_store, id);

		if (!amr_lt_owned_by(&amr_store, id, word, t->tree_no, t->generation))
			continue;
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
			pmem_leaves++;
		else if (AMR_WORD_TIER(word) == AMR_TIER_SSD)
			ssd_leaves++;
	}

	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	values[0] = Int32GetDatum((int32) t->height);
	values[1] = Int64GetDatum((int64) __atomic_load_n(&t->ninner, __ATOMIC_RELAXED));
	LWLockRelease(amr_tree_lock(t));
	values[2] = Int64GetDatum((int64) (pmem_leaves + ssd_leaves));
	values[3] = Int64GetDatum((int64) __atomic_load_n(&t->nentries, __ATOMIC_RELAXED));
	values[4] = Int64GetDatum((int64) (DatumGetInt64(values[1]) * sizeof(AmrInnerNode)));
	values[5] = Int64GetDatum((int64) (pmem_leaves * AMR_SLOT_SIZE));
	values[6] = Int64GetDatum((int64) (ssd_leaves * AMR_SLOT_SIZE));

	index_close(index, NoLock);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

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
	if (!has_privs_of_role(GetUserId(), ROLE_PG_MONITOR))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for function amrtree_pool_stats"),
				 errhint("Only roles with privileges of pg_monitor may see pool statistics.")));
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
 * Every entry of every leaf of an index, like pageinspect's page items:
 * (leaf_id, entry, tid, box, insert_lsn, dead).  For diagnosis; it reads the
 * whole index.
 */
Datum
amrtree_leaf_entries(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	index;
	AmrTree    *t;
	AmrLeaf    *buf;
	uint32		id;

	InitMaterializedSRF(fcinfo, 0);
	index = amr_open_index_for_inspection(indexoid, AccessShareLock);
	t = amr_tree_open(index);
	buf = amr_alloc_leaf_buffer();

	for (id = 0; id < amr_store.lt_capacity; id++)
	{
		uint64		word = amr_lt_word(&amr_store, id);
		uint64		i,
					n;

		if ((id & 0xFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (!amr_lt_owned_by(&amr_store, id, word, t->tree_no, t->generation))
			continue;
		if (amr_leaf_copy(index, t, id, buf, NULL, NULL) == 0)
			continue;
		n = buf->hdr.nentries;

		for (i = 0; i < n; i++)
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
			{
				BOX		   *b = palloc(sizeof(BOX));

				b->low.x = en->key.xlo;
				b->low.y = en->key.ylo;
				b->high.x = en->key.xhi;
				b->high.y = en->key.yhi;
				values[3] = BoxPGetDatum(b);
			}
			values[4] = LSNGetDatum((XLogRecPtr) en->insert_lsn);
			values[5] = BoolGetDatum((en->flags & AMR_ENTRY_FLAG_DEAD) != 0);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	index_close(index, NoLock);
	return (Datum) 0;
}
