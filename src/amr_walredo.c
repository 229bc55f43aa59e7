/*-------------------------------------------------------------------------
 *
 * amr_walredo.c
 *		Replaying amrtree's WAL records (docs/design.md, "WAL replay").
 *
 * Replay runs in the startup process: on a standby, in archive recovery,
 * and in crash recovery.  Before the first record it attaches the pool
 * (amr_attach: the DRAM tier is built from the Leaf Table, as after any
 * start), and from then on it changes leaves the way a backend does --
 * under the same publish, tree and leaf locks, through the leaf store --
 * so that hot-standby queries read the leaves and inner nodes while it
 * works.  It places leaves by this server's own budgets: records name
 * leaves by logical id, and the slots are this server's.
 *
 * Idempotence: a record may be replayed over a pool that already has its
 * change.  Two cases, told apart by how the server started
 * (amr_pool_may_be_a_copy):
 *
 * Crash recovery replays over the pool this server itself wrote, which is
 * ahead of the WAL: every change reached it when it was made, so only the
 * last change of a leaf, made after its record and interrupted by the
 * crash, can be missing -- and changes whose records never reached durable
 * WAL are there too.  Each leaf record carries the leaf's Leaf Table
 * version as the change left it (this server's own versions), and a record
 * whose version the leaf has reached is skipped, as PostgreSQL skips a
 * record older than its page's LSN.  Replaying it anyway would reset the
 * leaf to an older state while leaves changed after it keep their newer
 * one: a split whose record was lost would leave its right half holding
 * entries the reset left half holds again.  The exception is a change made
 * in place, which keeps the version: an append or dead marks logged as the
 * leaf's whole image (its first change after a checkpoint) is applied as
 * its delta record would be (redo_full_image_in_place).  A leaf VACUUM
 * freed after the record (the pool has its id free, or in a later leaf, at
 * a higher version) has the record superseded too, and FREE_LEAVES frees
 * the leaf by the version it had then (redo_free_leaves).  What lies beyond
 * the replayed WAL is found and logged again after recovery
 * (amr_reconcile.c).
 *
 * A base backup, archive recovery and a standby replay over a copy, which
 * may be torn but holds no change whose record the replay does not reach
 * (the backup ends after every change it copied).  Versions say nothing
 * there (a move changes one without a record), so:
 *
 *	- whole images (IMAGES, SPLIT) are installed unconditionally, as
 *	  PostgreSQL restores full-page images: the leaf becomes exactly what
 *	  it was when the record was written, and later records bring it
 *	  forward;
 *	- an APPEND is skipped if the leaf already holds its entry: the entry
 *	  at its position carries the record's end as its WAL position (the
 *	  primary stamps it so too), which no other entry can;
 *	- MARK_DEAD sets flags that stay set.
 *
 * A delta (APPEND, MARK_DEAD) is the first record of a leaf after a
 * checkpoint's redo pointer only when the primary decided on a stale look
 * at the pointer, and then the leaf's next record is its whole image
 * (amr_wal_delta_came_first); so a torn copy of a leaf is overwritten by
 * an image before any other delta applies to it.  Such a first delta that
 * does not fit the copy's later state is skipped and the leaf awaits the
 * image (await_image).
 *
 * A record that cannot be applied (the standby's pool has no room, its
 * Leaf Table is smaller than the primary's, a leaf it names is not where
 * the record says) marks the tree broken: its index raises an ERROR asking
 * for REINDEX, and its later records are skipped.  Replay itself never
 * stops: the rest of the cluster's WAL does not wait for amrtree.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"
#include "amr_wal.h"

#include "access/transam.h"
#include "access/xlog.h"
#include "access/xlogrecovery.h"
#include "access/xlogutils.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/standby.h"
#include "utils/memutils.h"

/* Replay can maintain the pool (it attached). */
static bool redo_active = false;

/* Replay over the pool this server wrote (crash recovery): see above. */
static bool redo_over_own_pool = false;

/*
 * Crash recovery: does the pool's leaf of tree t already have the change
 * that left it at "version" (reached_if_equal) or one that came after it?
 */
static bool
already_has(const AmrTree *t, uint32 leaf_id, uint32 version, bool reached_if_equal)
{
	uint64		word;
	uint32		have;

	if (!redo_over_own_pool)
		return false;
	word = amr_lt_word(&amr_store, leaf_id);
	have = AMR_WORD_VERSION(word);
	if (!amr_lt_owned_by(&amr_store, leaf_id, word, t->tree_no, t->generation))
	{
		/*
		 * The pool has the id freed, or in another tree, at a later version:
		 * the leaf was freed after this change (VACUUM's FREE_LEAVES, durable
		 * before the free) and perhaps reused since.  An id's versions only
		 * grow on this server, so the change is superseded.  Replaying it
		 * would bring the freed leaf back at the pool's version plus one,
		 * above the versions of its own later records, which would then be
		 * skipped as applied: dead marks were, and the leaf came back with
		 * entries VACUUM had removed (t/008, rounds with vacuum:pmem_full).
		 */
		return have > version;
	}
	return reached_if_equal ? have >= version : have > version;
}

/* Per-record memory, reset after each. */
static MemoryContext redo_cxt = NULL;

/* Leaf buffers (4 KiB aligned) kept across records. */
static AmrLeaf *redo_buf[3];

static void apply_append(AmrTree *t, uint32 leaf_id, uint32 pos, const AmrLeafEntry *e);
static void apply_dead_marks(AmrTree *t, uint32 leaf_id, const uint16 *pos, int npos,
							 XLogRecPtr lsn);

/* The tree the current record is about, to mark broken if replay fails. */
static int32 redo_tree_no = -1;

/* ---- trees ---- */

static bool
record_is_live(const AmrTreeRecord *rec)
{
	return rec->state == AMR_TREE_VALID || rec->state == AMR_TREE_BUILDING;
}

static bool
record_has(const AmrTreeRecord *rec, const xl_amr_tree *ref)
{
	return record_is_live(rec) && !(rec->flags & AMR_TREE_FLAG_TEMP) &&
		rec->db_oid == ref->db && rec->spc_oid == ref->spc &&
		rec->relfilenode == ref->relfilenode;
}

/*
 * The tree a record is about: the one in the directory record the primary
 * keeps it in, with its generation and storage -- replay creates every tree
 * there (redo_tree_create), and a copied pool has them there already.
 * Nothing else may be taken for it: a tree of the same storage in another
 * record is one that superseded it (an index rebuilt in place), and a record
 * of another generation is a later reuse (replay over a pool that is
 * ahead).  NULL if this server has no such tree (its pool is not a copy of
 * the primary's) or the tree is broken; redo_tree_no is set when it exists.
 */
static AmrTree *
redo_tree(const xl_amr_tree *ref)
{
	AmrStore   *s = &amr_store;
	AmrTreeRecord *rec;

	if (ref->tree_no >= AMR_MAX_TREES)
		return NULL;
	rec = &s->tree_records[ref->tree_no];
	if (!record_has(rec, ref) || rec->generation != ref->generation)
		return NULL;
	redo_tree_no = (int32) ref->tree_no;
	if (rec->flags & AMR_TREE_FLAG_BROKEN)
		return NULL;
	return &s->trees[ref->tree_no];
}

/* Give up on a tree: see the file header. */
static void
redo_broken(AmrTree *t, const char *why)
{
	AmrTreeRecord *rec = &amr_store.tree_records[t->tree_no];

	ereport(WARNING,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("amrtree: WAL replay cannot follow the tree of relation %u/%u/%u: %s",
					rec->spc_oid, rec->db_oid, rec->relfilenode, why),
			 errdetail("Its index cannot be used on this server until it is rebuilt."),
			 StandbyMode ?
			 errhint("REINDEX the index on the primary; this server follows.") :
			 errhint("Once recovery ends, the index is rebuilt in the background if amrtree.auto_rebuild is on; otherwise REINDEX it then.")));
	amr_tree_mark_broken(t->tree_no);
}

static void
redo_tree_create(XLogReaderState *record)
{
	AmrStore   *s = &amr_store;
	xl_amr_tree_create *x = (xl_amr_tree_create *) XLogRecGetData(record);
	uint32		tn = x->tree.tree_no;
	AmrTreeRecord *rec;
	AmrTree    *t;

	if (tn >= AMR_MAX_TREES)
		return;
	rec = &s->tree_records[tn];

	/*
	 * Generations only grow, on the primary and in replay alike: a record of
	 * this generation or a later one means the pool already has this creation
	 * (and perhaps the tree's drop and the record's reuse after it: replayed
	 * over a pool that is ahead, as in crash recovery).
	 */
	if (rec->generation >= x->tree.generation)
		return;
	/* the primary reuses this record: whatever it held is gone there */
	if (rec->state != AMR_TREE_FREE)
		amr_tree_free_storage(tn);

	LWLockAcquire(&amr_shared->directory_lock, LW_EXCLUSIVE);
	rec->flags = x->flags & (AMR_TREE_FLAG_UNLOGGED);
	rec->backend_id = -1;
	rec->db_oid = x->tree.db;
	rec->spc_oid = x->tree.spc;
	rec->relfilenode = x->tree.relfilenode;
	rec->index_oid = x->index_oid;
	rec->create_xid = x->create_xid;
	/* equal to the primary's, so that records and metapages name it */
	rec->generation = x->tree.generation;
	rec->create_lsn = record->EndRecPtr;
	rec->budget_kind = x->budget_kind;
	rec->tiering_off = x->tiering_off;
	rec->budget_value = x->budget_value;
	amr_persist(rec, sizeof(*rec));
	rec->state = AMR_TREE_BUILDING;
	amr_persist(&rec->state, sizeof(rec->state));
	LWLockRelease(&amr_shared->directory_lock);

	t = &s->trees[tn];
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	amr_tree_free_nodes(s, t);
	amr_tree_descriptor_init(t, tn, rec);
	/* no nodes until its leaves are known (TREE_BUILT, or first use) */
	t->inner_stale = 1;
	LWLockRelease(amr_tree_lock(t));
}

static void
redo_tree_drop(XLogReaderState *record)
{
	xl_amr_tree_drop *x = (xl_amr_tree_drop *) XLogRecGetData(record);

	if (redo_tree(&x->tree) != NULL || redo_tree_no >= 0)
		amr_tree_free_storage((uint32) redo_tree_no);
}

static void
redo_tree_built(XLogReaderState *record)
{
	xl_amr_tree_built *x = (xl_amr_tree_built *) XLogRecGetData(record);
	AmrTree    *t = redo_tree(&x->tree);

	/* its first use packs the inner nodes (amr_tree_open) */
	if (t != NULL)
		t->inner_stale = 1;
}

/* ---- leaves ---- */

/* A leaf image of tree t from logged entries, with this server's header. */
static void
image_from_record(AmrTree *t, AmrLeaf *img, uint32 leaf_id, uint16 flags,
				  const char *entries, uint16 nentries)
{
	amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation, 0,
						(flags & AMR_LEAF_FLAG_NULLS) != 0);
	memcpy(img->entries, entries, (Size) nentries * sizeof(AmrLeafEntry));
	img->hdr.nentries = nentries;
}

static AmrFBox
image_box(const AmrLeaf *img)
{
	return (img->hdr.flags & AMR_LEAF_FLAG_NULLS) ? amr_fbox_empty() : amr_leaf_image_mbr(img);
}

/*
 * Take a slot for a new image on the tier this server's budget wants, else
 * the other.  Returns false (the tree is then broken) if there is none.
 * Caller holds the publish lock shared.
 */
static bool
take_slot(AmrTree *t, AmrSlotPurpose purpose, bool adds, uint32 *tier, uint32 *slot)
{
	uint32		want = amr_tree_new_image_tier(t, 1, adds ? 1 : 0);

	if (amr_try_take_slot(purpose, want, tier, slot))
		return true;
	redo_broken(t, "this server's PMEM pool and SSD slot file have no free slot (raise amrtree.pmem_size or amrtree.ssd_size)");
	return false;
}

/*
 * Write img, as the version after word's, to a new slot (take_slot): with
 * the publish lock held shared on success, as publishing needs it; false,
 * nothing held, when there is no slot.
 */
static bool
write_next_version(AmrTree *t, AmrSlotPurpose purpose, bool adds, uint64 word,
				   AmrLeaf *img, uint32 *tier, uint32 *slot)
{
	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	if (!take_slot(t, purpose, adds, tier, slot))
	{
		LWLockRelease(&amr_shared->publish_lock);
		return false;
	}
	img->hdr.version = AMR_WORD_VERSION(word) + 1;
	amr_leaf_write_image(NULL, *tier, *slot, img);
	return true;
}

/*
 * Another live tree owns a leaf id that the record gives to t: this
 * server's pool disagrees with the primary's.  Take the id back from it
 * (its inner nodes are rebuilt at its next use).
 */
static void
take_back_leaf(uint32 leaf_id)
{
	AmrStore   *s = &amr_store;
	uint32		owner = s->lt[leaf_id].tree_no;
	AmrTree    *o;

	if (owner >= AMR_MAX_TREES)
		return;
	o = &s->trees[owner];
	ereport(LOG,
			(errmsg("amrtree: WAL replay gives leaf %u, which tree %u holds here, to another tree",
					leaf_id, owner)));
	LWLockAcquire(amr_tree_lock(o), LW_EXCLUSIVE);
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
	amr_leaf_free(o, leaf_id);
	LWLockRelease(amr_leaf_lock(leaf_id));
	o->inner_stale = 1;
	LWLockRelease(amr_tree_lock(o));
}

/*
 * Widen the inner boxes above a leaf, whose Leaf Table box is old_box, to
 * cover new_box.  Caller holds the tree lock (shared is enough: widening is
 * atomic and monotone, as inserts do it).  Replay keeps inner nodes where a
 * tree has them, and never needs them: a tree whose nodes are not built, or
 * in which the leaf is not under its box, is left for its first use to
 * pack (inner_stale).
 */
static void
widen_above(AmrTree *t, uint32 leaf_id, bool nulls, const AmrFBox *old_box,
			const AmrFBox *new_box)
{
	AmrPath		path;

	if (t->inner_stale || nulls || amr_fbox_is_empty(new_box) ||
		amr_fbox_covers(old_box, new_box))
		return;
	if (!amr_find_leaf_path(&amr_store, t, nulls, leaf_id, old_box, &path))
		t->inner_stale = 1;		/* not where its box says: pack them again */
	else
		amr_path_enlarge(&amr_store, &path, new_box);
}

/*
 * A leaf of tree t becomes exactly img, out of place: a new slot, the
 * inner boxes widened as needed, the word switched.  The leaf exists in t.
 */
static void
replace_leaf(AmrTree *t, uint32 leaf_id, AmrLeaf *img)
{
	AmrStore   *s = &amr_store;
	bool		nulls = (img->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0;
	AmrFBox		box = image_box(img);
	uint32		tier;
	uint32		slot;
	uint64		word = amr_lt_word(s, leaf_id);
	AmrFBox		old_box = amr_lt_mbr(s, leaf_id, word);
	uint64		before;

	if (!write_next_version(t, AMR_SLOT_REPLACES, false, word, img, &tier, &slot))
		return;

	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	widen_above(t, leaf_id, nulls, &old_box, &box);
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
	AMR_FAULT_POINT("redo:before_switch");
	before = amr_leaf_current_entries(leaf_id, word);
	/* a suspect leaf's old slot is not its to give: the store keeps it */
	(void) amr_leaf_switch(NULL, t, leaf_id, tier, slot, &box, img, false, AMR_LOG_NONE);

	/*
	 * The count changes with the leaf, under the tree lock: amrtree_check,
	 * holding it exclusively, compares the two (t/047).
	 */
	amr_counter_add(&t->nentries, amr_leaf_live_entries(img));
	amr_counter_sub(&t->nentries, before);
	LWLockRelease(amr_leaf_lock(leaf_id));
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);
	AMR_FAULT_POINT("redo:after_leaf_replaced");
}

/*
 * A leaf id that tree t does not have becomes a leaf of t holding img:
 * published and linked into the inner nodes where it fits best (a split's
 * right half goes next to its left one instead, see redo_split).
 */
static void
add_leaf(AmrTree *t, uint32 leaf_id, AmrLeaf *img, bool link)
{
	AmrStore   *s = &amr_store;
	bool		nulls = (img->hdr.flags & AMR_LEAF_FLAG_NULLS) != 0;
	AmrFBox		mbr = image_box(img);
	AmrFBox		zero = {0, 0, 0, 0};
	AmrFBox		box = nulls ? zero : mbr;
	uint32		tier;
	uint32		slot;
	uint64		word;

	if (AMR_WORD_TIER(amr_lt_word(s, leaf_id)) != AMR_TIER_NONE)
		take_back_leaf(leaf_id);
	word = amr_lt_word(s, leaf_id);

	if (!write_next_version(t, AMR_SLOT_ADDS, true, word, img, &tier, &slot))
		return;

	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	(void) amr_bitmap_set(s->leaf_ids_used, leaf_id);
	amr_lt_publish_new(s, leaf_id, t->tree_no, t->generation, nulls ? AMR_LT_FLAG_NULLS : 0,
					   AMR_INVALID_LEAF, 0, tier, slot, &mbr, img, 0);
	amr_leaf_volatile_reset(&s->leaves[leaf_id]);
	amr_counter_add(&t->nleaves, 1);
	amr_counter_add(&t->nentries, amr_leaf_live_entries(img));

	if (!link || t->inner_stale || (nulls ? t->null_root : t->root) == AMR_INVALID_NODE)
		t->inner_stale = 1;		/* the first use packs the nodes */
	else if (s->nodes[nulls ? t->null_root : t->root].count == 0)
		amr_add_first_leaf(s, t, nulls, leaf_id, &box);
	else
	{
		AmrPath		path;
		uint32		spare[AMR_MAX_HEIGHT + 1];
		int			need;
		int			i;
		AmrFBox		left_box;

		(void) amr_choose_leaf(s, t, nulls, &box, &path);
		need = amr_path_nodes_needed(s, &path);
		for (i = 0; i <= AMR_MAX_HEIGHT; i++)
			spare[i] = AMR_INVALID_NODE;
		for (i = 0; i < need; i++)
			if (need > AMR_MAX_HEIGHT || amr_node_alloc(s, &spare[i], 1) != AMR_OK)
				break;
		if (i < need)
		{
			/* no room for the nodes: the whole tree is packed again instead */
			for (i = 0; i <= AMR_MAX_HEIGHT; i++)
				if (spare[i] != AMR_INVALID_NODE)
					amr_node_free(s, spare[i]);
			t->inner_stale = 1;
		}
		else
		{
			if (!nulls)
				amr_path_enlarge(s, &path, &box);
			left_box = amr_node_entry_box(&s->nodes[path.node[path.depth - 1]],
										  path.idx[path.depth - 1]);
			amr_apply_leaf_split(s, t, nulls, &path, &left_box, leaf_id, &box, spare, NULL);
			for (i = 0; i <= AMR_MAX_HEIGHT; i++)
				if (spare[i] != AMR_INVALID_NODE)
					amr_node_free(s, spare[i]);
		}
	}
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);
}

/* Make leaf_id of t hold exactly img, whether t has it or not. */
static void
put_leaf(AmrTree *t, uint32 leaf_id, AmrLeaf *img, bool link)
{
	uint64		word = amr_lt_word(&amr_store, leaf_id);

	if (amr_lt_owned_by(&amr_store, leaf_id, word, t->tree_no, t->generation))
		replace_leaf(t, leaf_id, img);
	else
		add_leaf(t, leaf_id, img, link);
	amr_store.leaves[leaf_id].flags &= ~AMR_LEAF_VOLATILE_AWAITS_IMAGE;
}

static bool
leaf_id_fits(AmrTree *t, uint32 leaf_id)
{
	if (leaf_id < amr_store.lt_capacity)
		return true;
	redo_broken(t, psprintf("leaf id %u is beyond this server's Leaf Table of %u entries (set amrtree.pmem_size at least as large as the primary's)",
							leaf_id, amr_store.lt_capacity));
	return false;
}

/*
 * Crash recovery, a FULL image (an append's or VACUUM's dead marks, logged
 * whole) of a leaf at the version the record names: apply its change as
 * the delta record would have -- the entry at its fresh position
 * (apply_append tells by the position whether it got in), or the dead
 * marks (which stay set).
 */
static void
redo_full_image_in_place(AmrTree *t, const xl_amr_image *h, const char *entries,
						 XLogRecPtr lsn)
{
	if (h->fresh_pos != AMR_NO_FRESH_ENTRY)
	{
		AmrLeafEntry e;

		if (h->fresh_pos >= h->nentries)
			return;
		memcpy(&e, entries + (Size) h->fresh_pos * sizeof(AmrLeafEntry), sizeof(e));
		e.insert_lsn = lsn;
		apply_append(t, h->leaf_id, h->fresh_pos, &e);
	}
	else
	{
		uint16		pos[AMR_LEAF_CAPACITY];
		int			npos = 0;
		int			i;

		for (i = 0; i < h->nentries && i < AMR_LEAF_CAPACITY; i++)
		{
			AmrLeafEntry e;

			memcpy(&e, entries + (Size) i * sizeof(AmrLeafEntry), sizeof(e));
			if (e.flags & AMR_ENTRY_FLAG_DEAD)
				pos[npos++] = (uint16) i;
		}
		if (npos > 0)
			apply_dead_marks(t, h->leaf_id, pos, npos, lsn);
	}
}

/*
 * Whether a new image of a leaf drops an entry that a standby scan may be
 * returning from its old image: a live entry of old whose heap tuple no
 * live entry of img points to.
 */
static bool
drops_live_entry(const AmrLeaf *old, const AmrLeaf *img)
{
	int			i;
	int			j;

	for (i = 0; i < (int) old->hdr.nentries; i++)
	{
		const AmrLeafEntry *o = &old->entries[i];

		if (o->flags & AMR_ENTRY_FLAG_DEAD)
			continue;
		for (j = 0; j < (int) img->hdr.nentries; j++)
		{
			const AmrLeafEntry *n = &img->entries[j];

			if (!(n->flags & AMR_ENTRY_FLAG_DEAD) &&
				n->tid_blk_hi == o->tid_blk_hi && n->tid_blk_lo == o->tid_blk_lo &&
				n->tid_off == o->tid_off)
				break;
		}
		if (j == (int) img->hdr.nentries)
			return true;
	}
	return false;
}

/*
 * Hot standby: a change that may remove entries (a rewrite, a whole image
 * that may carry dead marks) must not leave an index-only scan returning a
 * removed entry once the heap records that follow mark its page
 * all-visible; replay waits for the scans that pin the leaf, as VACUUM
 * does on the primary (amr_pins.c).  The old image is read only when scans
 * may hold entries of the leaf; a pin that appears between that look and
 * the switch is waited for without knowing whether anything was dropped.
 */
static bool
image_may_drop_entries(AmrImageKind kind)
{
	return kind == AMR_IMAGE_FULL || kind == AMR_IMAGE_REWRITE || AMR_IMAGE_KIND_IS_RESYNC(kind);
}

/*
 * Whether standby scans may hold entries of the leaf: it is pinned, or a
 * split took its entries from a pinned leaf (amr_redo_note_split).
 */
static bool
scans_may_hold(AmrTree *t, uint32 leaf_id)
{
	return amr_sync_read(&t->pinned) > 0 &&
		(amr_sync_read(&amr_store.leaves[leaf_id].pins) > 0 ||
		 amr_store.leaves[leaf_id].replay_origin != 0);
}

/*
 * Hot standby: the whole images that the primary logged again after its
 * crash recovery (a resync record) replace leaves with what the primary's
 * pool holds, and that pool changed beyond the WAL this standby has: the
 * records of those changes never reached durable WAL.  If an image drops
 * live entries, they went by a change this standby never heard of -- a
 * split, which moved them to another leaf of the record, with no right link
 * that scans here could follow; or a VACUUM whose heap records, with their
 * snapshot conflicts, were lost too.  Either way a scan that began before
 * this record would miss rows its snapshot sees.  Nothing
 * says which snapshots still need them, so the record conflicts with every
 * snapshot taken before it, as a lost heap conflict would at the newest: its
 * queries are canceled past max_standby_streaming_delay, rather than
 * returning fewer rows than a sequential scan.
 */
static void
resync_resolve_conflicts(AmrTree *t)
{
	AmrTreeRecord *rec = &amr_store.tree_records[t->tree_no];
	RelFileNode node;
	TransactionId limit;

	if (!InHotStandby)
		return;
	node.spcNode = rec->spc_oid;
	node.dbNode = rec->db_oid;
	node.relNode = rec->relfilenode;
	/* every snapshot's xmin precedes or equals the next xid */
	LWLockAcquire(XidGenLock, LW_SHARED);
	limit = XidFromFullTransactionId(ShmemVariableCache->nextXid);
	LWLockRelease(XidGenLock);
	ResolveRecoveryConflictWithSnapshot(limit, node);
}

/*
 * The next image of an XLOG_AMR_IMAGES record's data (len bytes), at *off:
 * its header into *h and its entries' start into *entries, advancing *off
 * past both.  False at the end of the data.
 */
static bool
next_image(const char *data, Size len, Size *off, xl_amr_image *h,
		   const char **entries)
{
	if (*off + sizeof(xl_amr_image) > len)
		return false;
	memcpy(h, data + *off, sizeof(*h));
	*entries = data + *off + sizeof(*h);
	*off += sizeof(*h) + (Size) h->nentries * sizeof(AmrLeafEntry);
	return true;
}

static void
redo_image_list(XLogReaderState *record, AmrTree *t, bool may_drop)
{
	char	   *data = XLogRecGetData(record);
	Size		len = XLogRecGetDataLen(record);
	xl_amr_images *x = (xl_amr_images *) data;
	Size		off = sizeof(xl_amr_images);
	xl_amr_image h;
	const char *entries;
	int			i;

	for (i = 0; i < x->nimages && next_image(data, len, &off, &h, &entries); i++)
	{
		AmrLeaf    *img = redo_buf[0];
		AmrLeaf    *old;

		if (!leaf_id_fits(t, h.leaf_id))
			return;
		if (already_has(t, h.leaf_id, h.version, true))
		{
			/*
			 * An append or dead marks logged as the leaf's whole image (its
			 * first change after a checkpoint) leave the version as it was,
			 * so an equal version does not say whether the change got in
			 * before the crash.  Skipped, an entry cut off between its record
			 * and its store stayed out of this pool while a standby took it
			 * from the image, and outlived its heap tuple there.
			 */
			if (x->kind == AMR_IMAGE_FULL && !already_has(t, h.leaf_id, h.version, false))
			{
				redo_full_image_in_place(t, &h, entries, record->EndRecPtr);
				if (amr_store.tree_records[t->tree_no].flags & AMR_TREE_FLAG_BROKEN)
					return;
			}
			continue;
		}
		image_from_record(t, img, h.leaf_id, h.flags, entries, h.nentries);
		if (h.fresh_pos != AMR_NO_FRESH_ENTRY && h.fresh_pos < h.nentries)
			img->entries[h.fresh_pos].insert_lsn = record->EndRecPtr;
		old = NULL;
		if (may_drop && scans_may_hold(t, h.leaf_id) &&
			amr_leaf_read(NULL, t, h.leaf_id, redo_buf[1], NULL, NULL) != 0)
			old = redo_buf[1];
		put_leaf(t, h.leaf_id, img, x->kind != AMR_IMAGE_BUILD);
		if (amr_store.tree_records[t->tree_no].flags & AMR_TREE_FLAG_BROKEN)
			return;
		if (may_drop && scans_may_hold(t, h.leaf_id) &&
			(old == NULL || drops_live_entry(old, img)))
			amr_redo_wait_for_unpin(t, h.leaf_id);
	}
}

/*
 * Hot standby, before a resync record is applied: does one of its images
 * drop a live entry of the leaf this standby has?
 */
static bool
resync_drops_live_entry(XLogReaderState *record, AmrTree *t)
{
	char	   *data = XLogRecGetData(record);
	Size		len = XLogRecGetDataLen(record);
	xl_amr_images *x = (xl_amr_images *) data;
	Size		off = sizeof(xl_amr_images);
	xl_amr_image h;
	const char *entries;
	int			i;

	for (i = 0; i < x->nimages && next_image(data, len, &off, &h, &entries); i++)
	{
		if (h.leaf_id < amr_store.lt_capacity &&
			amr_leaf_read(NULL, t, h.leaf_id, redo_buf[1], NULL, NULL) != 0)
		{
			image_from_record(t, redo_buf[0], h.leaf_id, h.flags, entries, h.nentries);
			if (drops_live_entry(redo_buf[1], redo_buf[0]))
				return true;
		}
	}
	return false;
}

/*
 * Mark the tree's resync open (a part came, more follow) or closed (its
 * last record came), durably: a standby restarted in between resumes
 * replay after the part, and must still keep scans off the tree.
 */
static void
resync_set_open(AmrTree *t, bool open)
{
	AmrTreeRecord *rec = &amr_store.tree_records[t->tree_no];
	uint32		flags = open ? (rec->flags | AMR_TREE_FLAG_RESYNC_OPEN) :
	(rec->flags & ~AMR_TREE_FLAG_RESYNC_OPEN);

	if (flags == rec->flags)
		return;
	LWLockAcquire(&amr_shared->directory_lock, LW_EXCLUSIVE);
	rec->flags = flags;
	amr_persist(&rec->flags, sizeof(rec->flags));
	LWLockRelease(&amr_shared->directory_lock);
}

/*
 * A resync record (a primary's crash recovery logging again the leaves that
 * changed beyond the WAL it replayed) holds every changed leaf of one tree,
 * and its replay must look atomic to hot-standby scans: the leaves may
 * trade entries by a split whose record was lost, the first half's image
 * replacing the old full leaf in place (no NSN, no right link) and the
 * second half a leaf of its own, so a scan that saw some of the images and
 * not the others would miss rows or return them twice.  So
 *
 *	- if an image drops a live entry, the record conflicts with every
 *	  snapshot first (resync_resolve_conflicts), before anything changes;
 *	- the tree's resync_seq is odd while the images go in: scans that start
 *	  meanwhile wait for it to turn even (amr_scan.c), and a scan that
 *	  began before reads it again after every leaf and raises an error if
 *	  it changed, as it may have read some leaves before and some after;
 *	- a tree whose resync came in parts (AMR_IMAGE_RESYNC_PART, past
 *	  AMR_WAL_MAX_RESYNC_IMAGES) is marked open from the first part to the
 *	  last record, and scans refuse it meanwhile; a promotion or the end of
 *	  a point-in-time recovery between them leaves the index to be rebuilt
 *	  (amr_reconcile.c).
 *
 * Crash recovery over this server's own pool skips the images (its pool is
 * ahead) and marks nothing: the pass that follows logs them all again.
 */
static void
redo_resync(XLogReaderState *record, AmrTree *t, xl_amr_images *x)
{
	uint64		pass;

	if (InHotStandby && resync_drops_live_entry(record, t))
		resync_resolve_conflicts(t);
	if (!redo_over_own_pool && x->kind == AMR_IMAGE_RESYNC_PART)
		resync_set_open(t, true);

	/* no scan is collecting leaves while the count turns odd */
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	(void) amr_sync_add(&t->resync_seq, 1);
	LWLockRelease(amr_tree_lock(t));
	pass = amr_removal_pass_begin(t);
	PG_TRY();
	{
		redo_image_list(record, t, true);
	}
	PG_FINALLY();
	{
		amr_removal_pass_end(t, pass);
		(void) amr_sync_add(&t->resync_seq, 1);
	}
	PG_END_TRY();

	if (x->kind == AMR_IMAGE_RESYNC)
		resync_set_open(t, false);
}

static void
redo_images(XLogReaderState *record)
{
	xl_amr_images *x = (xl_amr_images *) XLogRecGetData(record);
	AmrTree    *t = redo_tree(&x->tree);
	bool		may_drop;
	uint64		pass = 0;

	if (t == NULL)
		return;
	if (AMR_IMAGE_KIND_IS_RESYNC(x->kind))
	{
		redo_resync(record, t, x);
		return;
	}
	may_drop = image_may_drop_entries(x->kind);
	/* standby scans check for removals since they read a leaf (amr_pins.c) */
	if (may_drop)
		pass = amr_removal_pass_begin(t);
	redo_image_list(record, t, may_drop);
	if (may_drop)
		amr_removal_pass_end(t, pass);
}

/*
 * Replay over a copy: can the pool no longer hold changes from beyond the
 * record being replayed?  PostgreSQL's consistent point covers a base
 * backup's torn copy (until the backup's end) and a write-back pool file
 * in crash recovery (until the end of the WAL).  A restarted standby's own
 * pool holds everything replay did before the stop while replay resumes
 * from the last restartpoint: PostgreSQL counts that as consistent at once
 * (minRecoveryPoint follows only the heap's page writes), amrtree only once
 * replay passes the pool's extent (amr_lineage_replay_caught_up; t/015 and
 * t/046 found a reused leaf id there).
 */
static bool
pool_not_ahead_of_replay(void)
{
	XLogRecPtr	extent;

	return reachedConsistency && amr_lineage_replay_caught_up(&extent);
}

/*
 * The current image of a leaf of t, copied into buf; 0 if t does not have
 * it, and the tree is then broken unless the pool may be ahead of replay.
 * No lock held.
 */
static uint64
read_leaf(AmrTree *t, uint32 leaf_id, AmrLeaf *buf, const char *what)
{
	uint64		word = amr_leaf_read(NULL, t, leaf_id, buf, NULL, NULL);

	if (word != 0)
		return word;

	/*
	 * A pool ahead of replay may have freed the leaf since (VACUUM's
	 * FREE_LEAVES comes later in the WAL): a delta that preceded the leaf's
	 * whole image (amr_wal_delta_came_first) then finds nothing, and the
	 * image and the free that follow settle the leaf.
	 */
	if (!redo_over_own_pool && !pool_not_ahead_of_replay())
		ereport(DEBUG1,
				(errmsg_internal("amrtree: %s names leaf %u, which the pool ahead of replay does not have; skipped",
								 what, leaf_id)));
	else
		redo_broken(t, psprintf("%s names leaf %u, which this server's tree does not have", what,
								leaf_id));
	return 0;
}

/*
 * Lock a leaf of t for a change in place (tree shared, leaf exclusive) and
 * return its PMEM image -- or NULL, with nothing locked, when the change
 * must go out of place (an SSD leaf, whose images are immutable) or cannot
 * find the leaf in place.
 */
static AmrLeaf *
lock_pmem_leaf(AmrTree *t, uint32 leaf_id, uint64 *word)
{
	AmrStore   *s = &amr_store;

	LWLockAcquire(amr_tree_lock(t), LW_SHARED);
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_EXCLUSIVE);
	*word = amr_lt_word(s, leaf_id);
	if (amr_lt_owned_by(s, leaf_id, *word, t->tree_no, t->generation) &&
		AMR_WORD_TIER(*word) == AMR_TIER_PMEM &&
		!(s->leaves[leaf_id].flags & AMR_LEAF_VOLATILE_SUSPECT))
		return amr_leaf_pmem_image(NULL, t, leaf_id, word);
	LWLockRelease(amr_leaf_lock(leaf_id));
	LWLockRelease(amr_tree_lock(t));
	return NULL;
}

static void
unlock_pmem_leaf(AmrTree *t, uint32 leaf_id)
{
	LWLockRelease(amr_leaf_lock(leaf_id));
	LWLockRelease(amr_tree_lock(t));
}

/*
 * What an APPEND finds at its position: whether the leaf already has the
 * record's entry there or something written after it (skip), or takes it.
 * Entry WAL positions tell: an appended entry carries its record's end, and
 * at one leaf version nothing else writes a position.  The one ambiguous
 * case -- our entry, dead -- is an append interrupted before its flag was
 * cleared, or one a later record marked dead: taking it is right for the
 * first, and for the second that later record, replayed after us, marks it
 * dead again (or, lost beyond the replayed WAL, concerned a tuple that the
 * next VACUUM still finds dead).
 */
static bool
append_has_happened(const AmrLeafEntry *cur, XLogRecPtr lsn)
{
	if (cur->insert_lsn > lsn)
		return true;
	return cur->insert_lsn == lsn && !(cur->flags & AMR_ENTRY_FLAG_DEAD);
}

/*
 * An APPEND that does not fit its leaf (its position beyond the entries):
 * over a copy, the copy holds a later state of the leaf.  Legitimately so
 * only if the primary logged this delta as the leaf's first record after
 * the redo pointer replay started from, on a stale look at the pointer; it
 * then logged the leaf whole in the leaf's next record
 * (amr_wal_delta_came_first), which puts it right.  So skip the delta and
 * let the leaf await that image; anything else (over the server's own
 * pool, or a second delta while awaiting) means the pool is not what the
 * WAL says: the tree is broken.  Returns whether the delta is skipped.
 */
static bool
await_image(uint32 leaf_id)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	if (redo_over_own_pool || (v->flags & AMR_LEAF_VOLATILE_AWAITS_IMAGE))
		return false;
	v->flags |= AMR_LEAF_VOLATILE_AWAITS_IMAGE;
	ereport(DEBUG1,
			(errmsg_internal("amrtree: leaf %u is ahead of a delta that preceded its whole image; awaiting the image",
							 leaf_id)));
	return true;
}

/* A delta for a leaf that awaits its whole image breaks the tree. */
static bool
awaits_image(AmrTree *t, uint32 leaf_id)
{
	if (!(amr_store.leaves[leaf_id].flags & AMR_LEAF_VOLATILE_AWAITS_IMAGE))
		return false;
	redo_broken(t, psprintf("leaf %u changed before the whole image it awaited", leaf_id));
	return true;
}

/*
 * Put entry e (its WAL position set) at position pos of a leaf of t, unless
 * the leaf has it already or something written after it (see
 * append_has_happened): in place on PMEM, as the primary did it, or as a new
 * image of an SSD leaf.
 */
static void
apply_append(AmrTree *t, uint32 leaf_id, uint32 pos, const AmrLeafEntry *e)
{
	AmrStore   *s = &amr_store;
	bool		nulls = (e->flags & AMR_ENTRY_FLAG_NULL) != 0;
	AmrFBox		box = amr_entry_fbox(e);
	uint64		word;
	AmrLeaf    *img = redo_buf[0];
	AmrLeaf    *leaf;

	if ((leaf = lock_pmem_leaf(t, leaf_id, &word)) != NULL)
	{
		/* in place, as the primary did it */
		uint64		n = leaf->hdr.nentries;
		AmrFBox		old_box = amr_lt_mbr(s, leaf_id, word);

		if (pos < n && append_has_happened(&leaf->entries[pos], e->insert_lsn))
			;					/* this leaf has seen the record */
		else if (pos > n || pos >= AMR_LEAF_CAPACITY)
		{
			unlock_pmem_leaf(t, leaf_id);
			if (await_image(leaf_id))
				return;
			redo_broken(t, psprintf("an entry goes to position %u of leaf %u, which has %u",
									pos, leaf_id, (unsigned) n));
			return;
		}
		else
		{
			AMR_FAULT_POINT("redo:before_append");
			widen_above(t, leaf_id, nulls, &old_box, &box);
			if (pos == n)
			{
				amr_leaf_append_pmem(s, leaf_id, leaf, e, &box);
				amr_counter_add(&t->nentries, 1);
			}
			else
			{
				bool		was_dead = (leaf->entries[pos].flags & AMR_ENTRY_FLAG_DEAD) != 0;

				amr_leaf_reuse_dead_pmem(s, leaf_id, leaf, pos, e, &box);
				if (was_dead)
					amr_counter_add(&t->nentries, 1);
			}
			amr_leaf_refresh_copy(leaf_id, leaf);
		}
		unlock_pmem_leaf(t, leaf_id);
		return;
	}

	/* an SSD leaf (immutable images): out of place */
	word = read_leaf(t, leaf_id, img, "an entry's record");
	if (word == 0)
		return;
	if (pos < img->hdr.nentries && append_has_happened(&img->entries[pos], e->insert_lsn))
		return;
	if (pos > img->hdr.nentries || pos >= AMR_LEAF_CAPACITY)
	{
		if (await_image(leaf_id))
			return;
		redo_broken(t, psprintf("an entry goes to position %u of leaf %u, which has %u",
								pos, leaf_id, (unsigned) img->hdr.nentries));
		return;
	}
	img->entries[pos] = *e;
	if (pos == img->hdr.nentries)
		img->hdr.nentries++;
	replace_leaf(t, leaf_id, img);
}

static void
redo_append(XLogReaderState *record)
{
	xl_amr_append xbuf;
	xl_amr_append *x = &xbuf;
	AmrTree    *t;
	AmrLeafEntry e;

	/* 70 bytes logged: copy them out aligned */
	memset(&xbuf, 0, sizeof(xbuf));
	memcpy(&xbuf, XLogRecGetData(record), Min(XLogRecGetDataLen(record), SizeOfXlAmrAppend));
	t = redo_tree(&x->tree);
	memset(&e, 0, sizeof(e));
	e.key = x->key;
	e.tid_blk_hi = x->tid_blk_hi;
	e.tid_blk_lo = x->tid_blk_lo;
	e.tid_off = x->tid_off;
	e.flags = x->flags;

	if (t == NULL || !leaf_id_fits(t, x->leaf_id) ||
		already_has(t, x->leaf_id, x->version, false) || awaits_image(t, x->leaf_id))
		return;
	e.insert_lsn = record->EndRecPtr;
	apply_append(t, x->leaf_id, x->pos, &e);
}

/*
 * Mark dead the entries at positions pos[] of a leaf of t that are live and
 * older than the record ending at lsn (an entry appended at a reused
 * position since is newer, and not the one the record meant).
 */
static void
apply_dead_marks(AmrTree *t, uint32 leaf_id, const uint16 *pos, int npos, XLogRecPtr lsn)
{
	uint64		word;
	AmrLeaf    *img = redo_buf[0];
	AmrLeaf    *leaf;
	int			i;

	if ((leaf = lock_pmem_leaf(t, leaf_id, &word)) != NULL)
	{
		uint64		marked = 0;

		for (i = 0; i < npos; i++)
			if (pos[i] < leaf->hdr.nentries &&
				!(leaf->entries[pos[i]].flags & AMR_ENTRY_FLAG_DEAD) &&
				leaf->entries[pos[i]].insert_lsn <= lsn)
			{
				amr_leaf_mark_dead(leaf, pos[i]);
				marked++;
			}
		amr_leaf_refresh_copy(leaf_id, leaf);
		amr_counter_sub(&t->nentries, marked);
		unlock_pmem_leaf(t, leaf_id);
		return;
	}

	word = read_leaf(t, leaf_id, img, "a VACUUM record");
	if (word == 0)
		return;
	for (i = 0; i < npos; i++)
		if (pos[i] < img->hdr.nentries && img->entries[pos[i]].insert_lsn <= lsn)
			img->entries[pos[i]].flags |= AMR_ENTRY_FLAG_DEAD;
	replace_leaf(t, leaf_id, img);
}

static void
redo_mark_dead(XLogReaderState *record)
{
	xl_amr_mark_dead *x = (xl_amr_mark_dead *) XLogRecGetData(record);
	const uint16 *pos = (const uint16 *) ((char *) x + sizeof(xl_amr_mark_dead));
	AmrTree    *t = redo_tree(&x->tree);
	uint64		pass;

	if (t == NULL || !leaf_id_fits(t, x->leaf_id) ||
		already_has(t, x->leaf_id, x->version, false) || awaits_image(t, x->leaf_id))
		return;
	pass = amr_removal_pass_begin(t);
	apply_dead_marks(t, x->leaf_id, pos, x->npos, record->EndRecPtr);
	/* a scan returning them must be done before the heap's VACUUM replays */
	amr_redo_wait_for_unpin(t, x->leaf_id);
	amr_removal_pass_end(t, pass);
}

/*
 * Empty leaves VACUUM freed.  The primary held the index's
 * AccessExclusiveLock, and a hot standby's startup process holds it too
 * (its record came first), so no standby scan is in the tree.
 *
 * Which leaf the record means: in crash recovery over this server's own
 * pool, the pool may be ahead, holding the id freed or already reused by a
 * later leaf.  Versions are this server's own and only grow, and replay
 * never takes a leaf past the version it had when it was freed (the record
 * carries it), while a later leaf of that id has a higher one: so the leaf
 * is freed if its version is not above the recorded one, whatever replay
 * left in it (the primary found it empty under its lock).  Elsewhere (a
 * standby, a copied pool) versions say nothing, every record is applied in
 * order, and the leaf must be empty here.  One that is not is kept while
 * the pool may be ahead of replay (pool_not_ahead_of_replay): it may be a
 * later leaf of the id, which later records replace.  After that the pool
 * disagrees with the primary's and the tree is given up rather than keep
 * entries of removed rows.  The inner nodes are packed again at the tree's
 * first use.
 */
static void
redo_free_leaves(XLogReaderState *record)
{
	AmrStore   *s = &amr_store;
	xl_amr_free_leaves *x = (xl_amr_free_leaves *) XLogRecGetData(record);
	const char *items = (const char *) x + sizeof(xl_amr_free_leaves);
	AmrTree    *t = redo_tree(&x->tree);
	uint32		freed = 0;
	uint32		diverged = AMR_INVALID_LEAF;
	uint64		diverged_live = 0;
	uint32		i;

	if (t == NULL ||
		XLogRecGetDataLen(record) < sizeof(xl_amr_free_leaves) +
		(Size) x->nleaves * sizeof(xl_amr_freed_leaf))
		return;
	/* none expected (see above); waited for with no lock held, as elsewhere */
	for (i = 0; i < x->nleaves && amr_sync_read(&t->pinned) > 0; i++)
	{
		xl_amr_freed_leaf f;

		memcpy(&f, items + (Size) i * sizeof(f), sizeof(f));
		if (f.leaf_id < s->lt_capacity)
			amr_redo_wait_for_unpin(t, f.leaf_id);
	}
	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	for (i = 0; i < x->nleaves; i++)
	{
		xl_amr_freed_leaf f;
		uint64		word;
		uint64		live;
		bool		frees;

		memcpy(&f, items + (Size) i * sizeof(f), sizeof(f));
		if (f.leaf_id >= s->lt_capacity)
			continue;
		LWLockAcquire(amr_leaf_lock(f.leaf_id), LW_EXCLUSIVE);
		word = amr_lt_word(s, f.leaf_id);
		if (amr_lt_owned_by(s, f.leaf_id, word, t->tree_no, t->generation))
		{
			live = amr_leaf_current_entries(f.leaf_id, word);
			frees = redo_over_own_pool ? AMR_WORD_VERSION(word) <= f.version : live == 0;
			if (frees)
			{
				amr_leaf_free(t, f.leaf_id);
				freed++;
			}
			if (frees && live > 0)
				ereport(LOG,
						(errmsg("amrtree: crash recovery frees leaf %u of tree %u, which VACUUM freed as empty, though replay left " UINT64_FORMAT " live entries in it",
								f.leaf_id, t->tree_no, live)));
			else if (!frees && live > 0 && !redo_over_own_pool &&
					 diverged == AMR_INVALID_LEAF && pool_not_ahead_of_replay())
			{
				/*
				 * This pool disagrees with the primary's, and the entries
				 * point at heap tuples that VACUUM removed there.
				 */
				diverged = f.leaf_id;
				diverged_live = live;
			}
		}
		LWLockRelease(amr_leaf_lock(f.leaf_id));
	}
	if (freed > 0)
		t->inner_stale = 1;
	LWLockRelease(amr_tree_lock(t));
	LWLockRelease(&amr_shared->publish_lock);
	if (diverged != AMR_INVALID_LEAF)
		redo_broken(t, psprintf("VACUUM freed leaf %u as empty, which holds " UINT64_FORMAT " live entries here",
								diverged, diverged_live));
}

/*
 * A split in the Leaf Table only, for a tree whose inner nodes wait for
 * their first use: what amr_split_commit does, but the inner nodes.  The
 * right half goes in first, recording its origin (see amr_ops.c); the right
 * links let scans that collected the left half before find the moved
 * entries.
 */
static void
split_in_leaf_table(AmrTree *t, uint32 leaf_id, uint64 word, AmrReservation *r,
					const AmrLeaf *left, const AmrLeaf *right, const AmrFBox *lbox,
					const AmrFBox *rbox, bool nulls)
{
	AmrStore   *s = &amr_store;
	AmrLeafVolatile *lv = &s->leaves[leaf_id];
	AmrLeafVolatile *rv = &s->leaves[r->new_leaf];
	uint64		old_word;

	amr_lt_publish_new(s, r->new_leaf, t->tree_no, t->generation, nulls ? AMR_LT_FLAG_NULLS : 0,
					   leaf_id, AMR_WORD_VERSION(word), r->tier_right, r->slot_right, rbox,
					   right, 0);
	old_word = amr_lt_switch(s, leaf_id, r->tier_left, r->slot_left, lbox, left, 0);
	amr_free_word_slot(s, old_word);
	amr_leaf_volatile_reset(rv);
	rv->nsn = lv->nsn;
	rv->rightlink = lv->rightlink;
	lv->nsn = amr_sync_add(&t->nsn, 1);
	lv->rightlink = r->new_leaf;
	amr_counter_add(&t->nleaves, 1);
	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = r->slot_right = AMR_INVALID_SLOT;
}

static void
redo_split(XLogReaderState *record)
{
	AmrStore   *s = &amr_store;
	xl_amr_split *x = (xl_amr_split *) XLogRecGetData(record);
	const char *entries = (const char *) x + sizeof(xl_amr_split);
	AmrTree    *t = redo_tree(&x->tree);
	AmrLeaf    *left = redo_buf[0];
	AmrLeaf    *right = redo_buf[1];
	bool		nulls = (x->flags & AMR_LEAF_FLAG_NULLS) != 0;
	AmrFBox		lbox;
	AmrFBox		rbox;
	AmrFBox		both;
	AmrReservation r;
	AmrPath		path;
	uint64		word;
	uint64		before;
	int			need;
	int			i;
	bool		linked;

	if (t == NULL || !leaf_id_fits(t, x->leaf_id) || !leaf_id_fits(t, x->right_leaf) ||
		already_has(t, x->leaf_id, x->left_version, true))
		return;
	image_from_record(t, left, x->leaf_id, x->flags, entries, x->nleft);
	image_from_record(t, right, x->right_leaf, x->flags,
					  entries + (Size) x->nleft * sizeof(AmrLeafEntry), x->nright);

	word = amr_lt_word(s, x->leaf_id);
	if (!amr_lt_owned_by(s, x->leaf_id, word, t->tree_no, t->generation) ||
		amr_lt_owned_by(s, x->right_leaf, amr_lt_word(s, x->right_leaf), t->tree_no,
						t->generation))
	{
		/* replayed over a pool that has the split, or lacks its origin */
		put_leaf(t, x->leaf_id, left, true);
		if (!(s->tree_records[t->tree_no].flags & AMR_TREE_FLAG_BROKEN))
			put_leaf(t, x->right_leaf, right, true);
		amr_redo_note_split(x->leaf_id, x->right_leaf);
		return;
	}
	if (AMR_WORD_TIER(amr_lt_word(s, x->right_leaf)) != AMR_TIER_NONE)
		take_back_leaf(x->right_leaf);

	lbox = image_box(left);
	rbox = image_box(right);
	both = lbox;
	amr_fbox_extend(&both, &rbox);

	LWLockAcquire(&amr_shared->publish_lock, LW_SHARED);
	amr_reservation_init(&r);
	r.new_leaf = x->right_leaf;
	if (!take_slot(t, AMR_SLOT_REPLACES, false, &r.tier_left, &r.slot_left) ||
		!take_slot(t, AMR_SLOT_ADDS, true, &r.tier_right, &r.slot_right))
	{
		r.new_leaf = AMR_INVALID_LEAF;
		amr_release_reservation(s, &r);
		LWLockRelease(&amr_shared->publish_lock);
		return;
	}
	(void) amr_bitmap_set(s->leaf_ids_used, x->right_leaf);
	left->hdr.version = AMR_WORD_VERSION(word) + 1;
	right->hdr.version = AMR_WORD_VERSION(amr_lt_word(s, x->right_leaf)) + 1;
	amr_leaf_write_image(NULL, r.tier_right, r.slot_right, right);
	amr_leaf_write_image(NULL, r.tier_left, r.slot_left, left);

	LWLockAcquire(amr_tree_lock(t), LW_EXCLUSIVE);
	/* the inner nodes take the new leaf if they exist and have room */
	linked = !t->inner_stale && !AMR_FAULT_ACTIVE("redo:split_unlinked") &&
		amr_find_leaf_path(s, t, nulls, x->leaf_id,
						   &s->lt[x->leaf_id].mbr[AMR_WORD_VERSION(word) & 1], &path);
	if (linked)
	{
		need = amr_path_nodes_needed(s, &path);
		for (i = 0; i < need && linked; i++)
		{
			if (i > AMR_MAX_HEIGHT || amr_node_alloc(s, &r.nodes[i], 1) != AMR_OK)
				linked = false;
			else
				r.nnodes++;
		}
	}
	if (!linked)
		t->inner_stale = 1;		/* the first use packs them */
	else if (!nulls)
		amr_path_enlarge(s, &path, &both);
	LWLockAcquire(amr_leaf_lock(x->leaf_id), LW_EXCLUSIVE);
	AMR_FAULT_POINT("redo:before_split");
	before = amr_leaf_current_entries(x->leaf_id, word);
	{
		bool		suspect = (s->leaves[x->leaf_id].flags & AMR_LEAF_VOLATILE_SUSPECT) != 0;

		if (linked)
			amr_split_commit(s, t, x->leaf_id, word, &path, nulls, &r, left, right, &lbox, &rbox, 0);
		else
			split_in_leaf_table(t, x->leaf_id, word, &r, left, right, &lbox, &rbox, nulls);
		if (suspect)
		{
			/* its old slot belongs to another leaf: take it back */
			(void) amr_bitmap_set(AMR_WORD_TIER(word) == AMR_TIER_SSD ? s->ssd_used : s->pmem_used,
								  AMR_WORD_SLOT(word));
			s->leaves[x->leaf_id].flags &= ~AMR_LEAF_VOLATILE_SUSPECT;
		}
		/* both halves travel whole */
		s->leaves[x->leaf_id].flags &= ~AMR_LEAF_VOLATILE_AWAITS_IMAGE;
	}
	amr_leaf_refresh_copy(x->leaf_id, left);
	/* the count with the leaves, under the tree lock, as in replace_leaf */
	amr_counter_add(&t->nentries, (uint64) x->nleft + x->nright);
	amr_counter_sub(&t->nentries, before);
	LWLockRelease(amr_leaf_lock(x->leaf_id));
	LWLockRelease(amr_tree_lock(t));
	amr_release_reservation(s, &r);
	LWLockRelease(&amr_shared->publish_lock);
	/* after the switch: a scan that read the left half before it has a pin */
	amr_redo_note_split(x->leaf_id, x->right_leaf);
}

/* ---- the resource manager's callbacks ---- */

/*
 * The pool holds changes from another history (amr_lineage.c): stop
 * maintaining it; queries leave its indexes out, and once the server is
 * promoted they are rebuilt.
 */
static void
give_up_pool(void)
{
	pg_atomic_write_u32(&amr_shared->replay_failed, 1);
	redo_active = false;
}

/*
 * The pool's WAL extent covers this record before its change is made;
 * false if that settled a pending check against the pool.
 */
static bool
note_extent(XLogReaderState *record)
{
	TimeLineID	tli;

	(void) GetCurrentReplayRecPtr(&tli);
	if (amr_lineage_note(record->EndRecPtr, tli, true))
		return true;
	give_up_pool();
	return false;
}

void
amr_redo_startup(void)
{
	MemoryContext old;
	int			i;

	redo_active = false;
	if (!amr_preloaded || amr_shared == NULL || !amr_pool_is_open())
		return;					/* the pool's own error is raised at every use */
	redo_over_own_pool = !amr_pool_may_be_a_copy();
	if (redo_cxt == NULL)
	{
		MemoryContext keep = AllocSetContextCreate(TopMemoryContext, "amrtree replay buffers",
												   ALLOCSET_SMALL_SIZES);

		redo_cxt = AllocSetContextCreate(TopMemoryContext, "amrtree replay",
										 ALLOCSET_DEFAULT_SIZES);
		old = MemoryContextSwitchTo(keep);
		for (i = 0; i < lengthof(redo_buf); i++)
			redo_buf[i] = amr_alloc_leaf_buffer();
		MemoryContextSwitchTo(old);
	}
	old = MemoryContextSwitchTo(redo_cxt);
	PG_TRY();
	{
		amr_attach(true);
		pg_atomic_write_u32(&amr_shared->attached, 1);
		redo_active = true;
		amr_wb_recovery_register_exit();

		/*
		 * The pool was given up before replay began (a write-back file not
		 * complete up to where replay starts: amr_writeback.c, wb_load): its
		 * trees are dropped when recovery ends, and until then a hot
		 * standby's queries must not read them.
		 */
		if (amr_store.header->history_reset != 0)
			give_up_pool();
		/* the timeline recovery targets may rule the pool out */
		else if (!amr_lineage_at_redo_start())
			give_up_pool();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(redo_cxt);
		edata = CopyErrorData();
		FlushErrorState();
		LWLockReleaseAll();
		ereport(WARNING,
				(errmsg("amrtree: WAL replay cannot maintain the PMEM pool: %s", edata->message),
				 edata->detail ? errdetail("%s", edata->detail) : 0,
				 errhint("Queries on this server do not use amrtree indexes; once it is promoted, they are rebuilt in the background (amrtree.auto_rebuild) or need REINDEX.")));
		amr_store.header->history_reset = 1;
		amr_persist(&amr_store.header->history_reset, sizeof(amr_store.header->history_reset));
		pg_atomic_write_u32(&amr_shared->replay_failed, 1);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	MemoryContextReset(redo_cxt);
}

void
amr_redo(XLogReaderState *record)
{
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;
	MemoryContext old;

	if (!redo_active)
		return;
	redo_tree_no = -1;
	old = MemoryContextSwitchTo(redo_cxt);
	if (!note_extent(record))
	{
		MemoryContextSwitchTo(old);
		MemoryContextReset(redo_cxt);
		return;
	}
	PG_TRY();
	{
		switch (info)
		{
			case XLOG_AMR_TREE_CREATE:
				redo_tree_create(record);
				break;
			case XLOG_AMR_TREE_DROP:
				redo_tree_drop(record);
				break;
			case XLOG_AMR_TREE_BUILT:
				redo_tree_built(record);
				break;
			case XLOG_AMR_IMAGES:
				redo_images(record);
				break;
			case XLOG_AMR_APPEND:
				redo_append(record);
				break;
			case XLOG_AMR_MARK_DEAD:
				redo_mark_dead(record);
				break;
			case XLOG_AMR_SPLIT:
				redo_split(record);
				break;
			case XLOG_AMR_FREE_LEAVES:
				redo_free_leaves(record);
				break;
			default:
				ereport(WARNING,
						(errmsg("amrtree: unknown WAL record type 0x%02x ignored", info),
						 errhint("A newer amrtree wrote it, or another extension uses resource manager id %d: see amrtree.wal_rmgr_id.",
								 amr_wal_rmgr_id)));
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(redo_cxt);
		edata = CopyErrorData();
		FlushErrorState();
		LWLockReleaseAll();
		if (redo_tree_no >= 0)
			redo_broken(&amr_store.trees[redo_tree_no], edata->message);
		else
			ereport(WARNING,
					(errmsg("amrtree: could not replay a %s record: %s",
							amr_identify(info) ? amr_identify(info) : "?", edata->message)));
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	MemoryContextReset(redo_cxt);
}

void
amr_redo_cleanup(void)
{
	if (!amr_preloaded || amr_shared == NULL)
		return;
	if (amr_pool_is_open())
		amr_lineage_at_redo_end();
	/* before the end-of-recovery checkpoint, which waits for no fence */
	amr_wb_recovery_done();
	amr_note_replay_end(GetXLogReplayRecPtr(NULL));
}
